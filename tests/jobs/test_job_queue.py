"""The job queue against a real SQLite ledger: order, position, all-or-nothing, quotas."""

import pytest

from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import parse_simulated
from gpulab.scheduler.ledger import Ledger
from gpulab.scheduler.policy import get_policy
from gpulab.scheduler.queue import JobQueue, never_fits
from gpulab.scheduler.quota import Quotas


@pytest.fixture
def setup(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/q.sqlite")
    ledger = Ledger(
        engine,
        parse_simulated("2xA100-80GB", node="n1"),
        get_policy("best-fit"),
        Quotas(user_milli={"capped": 1000}),
    )
    return JobQueue(engine), ledger


def add(q, job_id, user="alice", ranks=1, milli=500, priority=0):
    return q.add(
        {
            "id": job_id,
            "user": user,
            "name": job_id,
            "priority": priority,
            "backend": "local",
            "nodes": 1,
            "nproc_per_node": ranks,
            "gpu_milli": milli,
        }
    )


def members(job):
    return [(f"{job['id']}/{r}", job["gpu_milli"]) for r in range(job["nproc_per_node"])]


def admit(q, ledger):
    return [j["id"] for j, _ in q.admit(ledger, {}, members)[0]]


def test_priority_first_then_first_come(setup):
    q, ledger = setup
    ledger.allocate_gang("x", "job", [("full/0", 1000), ("full/1", 1000)])
    add(q, "a")
    add(q, "b", priority=-1)
    add(q, "c")
    add(q, "d", priority=5)
    assert [j["id"] for j in q.queued()] == ["d", "a", "c", "b"]
    assert [q.position(j) for j in "dacb"] == [1, 2, 3, 4]
    assert admit(q, ledger) == []
    assert "waiting for free GPUs" in q.get("d")["message"]
    ledger.release("job", "full/0")
    ledger.release("job", "full/1")
    assert admit(q, ledger) == ["d", "a", "c", "b"]
    assert q.position("d") is None and q.get("d")["state"] == "running"


def test_a_gang_gets_every_slice_or_none(setup):
    q, ledger = setup
    ledger.allocate("x", "server", "x/", 500)  # 1500 free: a 4 x 500 job cannot start
    add(q, "big", ranks=4)
    add(q, "small", ranks=1)
    assert admit(q, ledger) == []  # the head waits, and so does what is behind it
    assert [a["owner"] for a in ledger.list(owner_kind="job")] == []
    ledger.release("server", "x/")
    assert admit(q, ledger) == ["big"]
    assert sorted(a["owner"] for a in ledger.list(owner_kind="job")) == [
        "big/0",
        "big/1",
        "big/2",
        "big/3",
    ]


def test_waiting_for_quota_does_not_hold_up_others(setup):
    q, ledger = setup
    ledger.allocate("capped", "server", "capped/", 1000)
    add(q, "mine", user="capped")
    add(q, "theirs", user="alice")
    assert admit(q, ledger) == ["theirs"]
    assert q.get("mine")["message"].startswith("waiting for quota: over your quota")
    ledger.release("server", "capped/")
    assert admit(q, ledger) == ["mine"]


def test_finish_happens_once(setup):
    q, _ = setup
    add(q, "j")
    assert q.finish("j", "cancelled", "cancelled by its owner")
    assert not q.finish("j", "failed", "late")
    assert q.get("j")["state"] == "cancelled" and q.get("j")["finished"]


def test_never_fits_names_the_limit():
    quotas = Quotas(default_user_milli=2000, group_milli={"lab": 1000})
    assert never_fits(quotas, "u", 2000, {}) is None
    assert never_fits(quotas, "u", 0, {"lab": {"u"}}) is None
    assert "needs 3 GPUs in all and your quota is 2 GPUs" in never_fits(quotas, "u", 3000, {})
    assert "group 'lab'" in never_fits(quotas, "u", 1500, {"lab": {"u", "v"}})


def test_the_newest_jobs_are_read_by_the_database_not_all_of_them(setup):
    """The gpulab page shows a user's last jobs: it read every job ever submitted (with
    each failed one's error, up to 1 MiB) to keep 50."""
    q, _ = setup
    for i in range(5):
        add(q, f"a{i}", user="alice")
        add(q, f"b{i}", user="bob")
    assert [j["id"] for j in q.newest("alice", 3)] == ["a4", "a3", "a2"]
    assert [j["id"] for j in q.newest(None, 2)] == ["b4", "a4"]


def test_a_gang_no_empty_pool_could_place_does_not_hold_up_the_queue(setup):
    """Queued before the site shrank (or before submit refused such gangs): three
    whole-GPU ranks on a 2-GPU machine never start, and wait aside, saying why."""
    q, ledger = setup
    ledger.allocate("x", "server", "x/", 500)
    add(q, "never", ranks=3, milli=1000, priority=5)
    add(q, "small", ranks=1)
    assert admit(q, ledger) == ["small"]
    message = q.get("never")["message"]
    assert q.get("never")["state"] == "queued"
    assert "no pool here could place it even with every GPU free" in message, message
    assert "cancel it and submit a smaller one" in message
