"""The ledger against real SQLite files and a real PostgreSQL server."""

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import parse_simulated
from gpulab.scheduler.ledger import Ledger, NoCapacity, OwnerConflict
from gpulab.scheduler.policy import get_policy
from gpulab.scheduler.quota import QuotaExceeded, Quotas


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.sqlite"
    return request.getfixturevalue("postgres_db")  # empty, of this test's own


def make_ledger(url, spec="2xA100-80GB", quotas=None):
    return Ledger(
        make_engine(url), parse_simulated(spec, node="n1"), get_policy("best-fit"), quotas
    )


def test_quarters_fill_one_gpu_before_the_next(db_url):
    ledger = make_ledger(db_url)
    first = ledger.allocate("alice", "server", "alice/", 250)
    second = ledger.allocate("bob", "server", "bob/", 250)
    assert first[0]["gpu_uuid"] == second[0]["gpu_uuid"]
    assert first[0]["memory_mib"] == 80 * 1024 // 4
    assert ledger.usage() == {"alice": 250, "bob": 250}


def test_whole_gpus_and_no_capacity_message(db_url):
    ledger = make_ledger(db_url)
    rows = ledger.allocate("alice", "job", "j1", 2000)
    assert len(rows) == 2 and {r["milli"] for r in rows} == {1000}
    with pytest.raises(NoCapacity, match="no GPU has room for 1/4 GPU"):
        ledger.allocate("bob", "server", "bob/", 250)
    assert ledger.release("job", "j1")
    assert ledger.allocate("bob", "server", "bob/", 250)


def test_allocation_is_idempotent_per_owner(db_url):
    ledger = make_ledger(db_url)
    a = ledger.allocate("alice", "server", "alice/", 500)
    b = ledger.allocate("alice", "server", "alice/", 500)
    assert a == b and len(ledger.list()) == 1
    with pytest.raises(OwnerConflict):
        ledger.allocate("alice", "server", "alice/", 250)


def test_quota_user_and_group(db_url):
    quotas = Quotas(default_user_milli=500, user_milli={"carol": 2000}, group_milli={"lab": 750})
    ledger = make_ledger(db_url, quotas=quotas)
    ledger.allocate("alice", "server", "alice/", 500)
    with pytest.raises(QuotaExceeded, match="over your quota: you hold 1/2 GPU of your 1/2 GPU"):
        ledger.allocate("alice", "job", "j1", 100)
    lab = {"lab": {"bob", "dave"}}
    ledger.allocate("bob", "server", "bob/", 500, groups=lab)
    with pytest.raises(QuotaExceeded, match="group 'lab'"):
        ledger.allocate("dave", "server", "dave/", 500, groups=lab)
    ledger.allocate("carol", "server", "carol/", 1000)
    assert len(ledger.list()) == 3


def test_concurrent_requests_never_oversubscribe(db_url):
    ledger = make_ledger(db_url)

    def ask(i):
        try:
            return ledger.allocate(f"u{i}", "server", f"u{i}/", 250)
        except NoCapacity:
            return None

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(ask, range(20)))
    assert sum(r is not None for r in results) == 8
    assert all(m <= 1000 for m in ledger.allocated_by_gpu().values())


def test_two_processes_share_one_database(db_url, tmp_path):
    """Separate service processes on one database still never oversubscribe."""
    script = textwrap.dedent(f"""
        import sys
        from gpulab.db.engine import make_engine
        from gpulab.scheduler.inventory import parse_simulated
        from gpulab.scheduler.ledger import Ledger, NoCapacity
        from gpulab.scheduler.policy import get_policy
        ledger = Ledger(make_engine({db_url!r}), parse_simulated("2xA100-80GB", node="n1"),
                        get_policy("best-fit"))
        ok = 0
        for i in range(10):
            try:
                owner = f"p{{sys.argv[1]}}-{{i}}"
                ledger.allocate(owner, "server", owner + "/", 100)
                ok += 1
            except NoCapacity:
                pass
        print(ok)
    """)
    make_engine(db_url)  # create tables once, before the race
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(p)], stdout=subprocess.PIPE, text=True)
        for p in range(3)
    ]
    placed = sum(int(p.communicate(timeout=120)[0]) for p in procs)
    ledger = make_ledger(db_url)
    assert placed == 20  # 30 asked for 100 milli on 2 GPUs: room for 20
    assert sorted(ledger.allocated_by_gpu().values()) == [1000, 1000]


def test_availability_counts_and_reasons(db_url):
    ledger = make_ledger(db_url, quotas=Quotas(default_user_milli=1000))
    ledger.allocate("bob", "server", "bob/", 1000)
    sizes = {a.milli: a for a in ledger.availability("alice", [0, 250, 1000, 2000])}
    assert sizes[250].count == 4 and sizes[1000].count == 1
    # Two GPUs would not fit anyway, but the quota is what the user can act on.
    assert sizes[2000].count == 0 and "over your quota" in sizes[2000].reason
    unlimited = make_ledger(db_url)
    # bob's whole GPU leaves one free: the form says what a 2-GPU server would need.
    assert unlimited.availability("alice", [2000])[0].reason == (
        "needs 2 whole GPUs free on one node; at most 1 is free on any node now"
    )
    assert unlimited.availability("alice", [1000])[0].count == 1
    ledger.allocate("alice", "server", "alice/", 500)
    sizes = {a.milli: a for a in ledger.availability("alice", [250, 1000])}
    assert sizes[250].count == 2
    assert sizes[1000].count == 0 and "quota" in sizes[1000].reason


def test_reconcile_releases_dead_owners(db_url):
    ledger = make_ledger(db_url)
    ledger.allocate("alice", "server", "alice/", 250)
    ledger.allocate("bob", "server", "bob/", 250)
    ledger.allocate("bob", "job", "j1", 250)
    released = ledger.reconcile("server", {"alice/"})
    assert [r["owner"] for r in released] == ["bob/"]
    assert {r["owner"] for r in ledger.list()} == {"alice/", "j1"}


def test_gang_allocation_is_all_or_nothing(db_url):
    ledger = make_ledger(db_url)
    ledger.allocate("bob", "server", "bob/", 1000)
    ranks = [(f"job1/{r}", 500) for r in range(3)]
    with pytest.raises(NoCapacity, match="3 x 1/2 GPU"):
        ledger.allocate_gang("alice", "job", ranks)
    assert ledger.list(user="alice") == []
    rows = ledger.allocate_gang("alice", "job", ranks[:2])
    assert {r["owner"] for r in rows} == {"job1/0", "job1/1"}
    # A retry of the same gang returns what it holds, nothing more.
    assert len(ledger.allocate_gang("alice", "job", ranks[:2])) == 2
    assert ledger.allocated_by_gpu() == {r["gpu_uuid"]: 1000 for r in rows} | {
        ledger.list(user="bob")[0]["gpu_uuid"]: 1000
    }


def test_node_groups_put_each_node_rank_on_a_node_of_its_own(tmp_path):
    # Two nodes of two GPUs; best-fit alone would pack a 2-node job onto one node.
    gpus = parse_simulated("2xA100-80GB", node="n1") + parse_simulated("2xA100-80GB", node="n2")
    ledger = Ledger(make_engine(f"sqlite:///{tmp_path}/l.db"), gpus, get_policy("best-fit"))
    ranks = [(f"job1/{r}", 250) for r in range(4)]  # 2 nodes x 2 ranks
    packed = ledger.allocate_gang("alice", "job", ranks[:2])
    assert len({r["node"] for r in packed}) == 1  # what the local backend gets
    ledger.release("job", "job1/0"), ledger.release("job", "job1/1")
    rows = ledger.allocate_gang("alice", "job", ranks, node_groups=[0, 0, 1, 1])
    node = {r["owner"]: r["node"] for r in rows}
    assert node["job1/0"] == node["job1/1"] != node["job1/2"] == node["job1/3"]
    # A retry keeps the rows and their nodes.
    again = ledger.allocate_gang("alice", "job", ranks, node_groups=[0, 0, 1, 1])
    assert {r["owner"]: r["node"] for r in again} == node
    # Three node ranks cannot fit on two nodes, whatever room each has.
    three = [(f"job2/{r}", 100) for r in range(3)]
    with pytest.raises(NoCapacity):
        ledger.allocate_gang("bob", "job", three, node_groups=[0, 1, 2])
    assert ledger.list(user="bob") == []
