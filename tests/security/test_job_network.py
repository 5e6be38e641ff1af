"""A job's network belongs to its owner (issue 24): the c10d attack, against a
running 2-node job, from another user's account in the host's namespace and from
another network namespace, finds nothing to connect to; the job finishes untouched.

Everything is real: the local backend as the service runs it (real accounts made
with ``useradd``, the nodes' cgroups, torchrun agents and ranks as the owner), the
job's own network namespace and its slirp4netns, and an attacker who is a second
real account running torch's own ``TCPStore`` and ``torchrun``. The second
namespace, its veth pair and private 10.x addresses exist only for the test. Needs
root (CI runs as root): without it there are no accounts, and every job runs in the
host's network as one account anyway.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from hubproc import fresh_user, let_accounts_reach
from support.wait import wait_until, wait_until_async

from gpulab.backend import job_network
from gpulab.backend.job_network import JobNetwork, netns_name
from gpulab.backend.local import LocalBackend
from gpulab.backend.spec import JobSpec
from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.accounts import UserAccounts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="accounts and network namespaces need root"),
]
ATTACKS = Path(__file__).with_name("c10d_attacks.py").read_text()
from cells import FAILS_ON_RANK_1, LINEAR, SLEEPS  # noqa: E402

#: What a job in its own namespace tries: a server on the host's address (outbound
#: through slirp4netns) and one on the host's loopback (not shared with jobs).
REACH_OUT = """
import os, socket
from gpulab.training import setup
ctx = setup()
for name in ("OUT_ADDR", "HOST_LOOPBACK"):
    host, port = os.environ[name].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
        print(name, "reached", flush=True)
    except OSError as e:
        print(name, "not reached:", type(e).__name__, flush=True)
ctx.barrier()
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def site(tmp_path):
    """Accounts and limits as the service has them as root, a jobs folder the accounts
    reach, and the users: the job's owner and an attacker; removed afterwards."""
    let_accounts_reach(tmp_path)
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    owner, attacker = fresh_user("netowner"), fresh_user("netattacker")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shared = tmp_path / "shared"  # where the pickle would leave its file (anyone may write)
    shared.mkdir()
    shared.chmod(0o1777)
    made = []
    try:
        yield {
            "accounts": accounts,
            "jobs": str(jobs),
            "owner": owner,
            "attacker": accounts.ensure(attacker),
            "shared": shared,
            "made": made,
        }
    finally:
        for backend, spec in made:
            asyncio.run(backend.cancel(spec, grace_s=2))
        for name in (owner, attacker):
            subprocess.run(["userdel", accounts.name_for(name)], capture_output=True)


def backend(site, mode: str = "private") -> LocalBackend:
    return LocalBackend(
        site["jobs"],
        accounts=site["accounts"],
        limits=AccountLimits(),
        network=JobNetwork(mode=mode),
    )


def start(site, be: LocalBackend, code: str, **env) -> tuple:
    """A 2-node job of the owner's, started as the service starts one."""
    spec = JobSpec(code=code, nodes=2, nproc_per_node=1, user=site["owner"], env=env)
    spec.id = uuid.uuid4().hex[:12]
    spec.validate()
    jd = be.jobdir(spec.id)
    spec.checkpoint_dir = jd.p("checkpoints")
    jd.write_inputs(spec)
    asyncio.run(be.start(spec, []))
    site["made"].append((be, spec))
    return spec, jd


def logs_of(jd) -> str:
    return "\n".join(
        Path(p).read_text(errors="replace")[-3000:]
        for _, p in jd.log_sources()
        if os.path.exists(p)
    )


def wait_step(be: LocalBackend, spec, jd, step: int) -> None:
    """Until rank 0 has reported ``step`` steps; the job's logs if it ended before."""

    def reached():
        status = asyncio.run(be.poll(spec))
        assert status.state == "running", f"{status}\n{logs_of(jd)}"
        return len(jd.metrics(0)[0]) >= step

    wait_until(reached, f"job {spec.id} at step {step}", detail=lambda: logs_of(jd))


def finish(be: LocalBackend, spec):
    async def ended():
        status = await be.poll(spec)
        return status if status.state != "running" else None

    return asyncio.run(wait_until_async(ended, f"job {spec.id} to end", 300))


def job_processes(jd) -> list[psutil.Process]:
    launch = json.loads(Path(jd.p("launch.json")).read_text())
    procs = []
    for node in launch["nodes"]:
        with_children = psutil.Process(node["pid"])
        procs += [with_children, *with_children.children(recursive=True)]
    return procs


def listening_ports(procs: list[psutil.Process]) -> set[int]:
    """The TCP ports the job's processes listen on, as root sees them from inside the
    job's network (``/proc/<pid>/net/tcp*`` is the table of that process's namespace)."""
    inodes: set[str] = set()
    for p in procs:
        try:
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for p in procs[:1]:
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{p.pid}/net/{table}") as f:
                for line in list(f)[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, one of theirs
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses but loopback (where a store on all interfaces is)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [
        ln.split()[3].split("/")[0]
        for ln in out.splitlines()
        if ln.split()[1] != "lo" and not ln.split()[1].startswith(("gpl", "gnet"))
    ]


def attack_from_account(site, target: dict) -> subprocess.Popen:
    """The attack, run as the attacker's account in the host's namespace (started; its
    result comes from :func:`result_of`)."""
    account = site["attacker"]
    return subprocess.Popen(
        [sys.executable, "-c", f"TARGET = {json.dumps(target)}\n{ATTACKS}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**account.env(), "PATH": os.environ["PATH"]},
        cwd=account.home,
        **account.popen_kwargs(),
    )


@pytest.fixture
def other_namespace():
    """Another machine, as far as the network goes: a namespace joined to the host by a
    veth pair only. Yields (its name, the host's address on that link)."""
    tag = f"{os.getpid() % 1000:03d}{random.randint(0, 9)}"
    octet = random.randint(1, 250)
    ns, host_if, ns_if = f"gnetn{tag}", f"gneth{tag}", f"gnetv{tag}"
    host_addr, ns_addr = f"10.224.{octet}.1", f"10.224.{octet}.2"
    try:
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        yield ns, host_addr
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)


def attack_from_namespace(ns: str, target: dict) -> subprocess.Popen:
    """The attack from the other namespace (as its root: a machine with no login here);
    started, as :func:`attack_from_account`."""
    return subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-c",
            f"TARGET = {json.dumps(target)}\n{ATTACKS}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def result_of(attack: subprocess.Popen) -> dict:
    """What a started attack found, once it has ended."""
    try:
        out, _ = attack.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        attack.kill()
        out, _ = attack.communicate()
    line = next((ln for ln in out.splitlines() if ln.startswith("C10D-RESULT ")), None)
    assert line, f"no result from the attack (exit {attack.returncode}):\n{out[-3000:]}"
    return json.loads(line.removeprefix("C10D-RESULT "))


def assert_nothing_reached(results: dict) -> None:
    assert results["read the rendezvous endpoint from /proc/*/cmdline"].startswith("found"), results
    reached = {what: how for what, how in results.items() if how.startswith("ALLOWED")}
    assert not reached, json.dumps(results, indent=1)
    assert any(k.startswith("join") for k in results) and any("compare_set" in k for k in results)


def no_trace_of(job_id: str) -> bool:
    return not job_network.exists(job_id) and not job_network.outbound_pids(job_id)


def test_the_c10d_attack_reaches_nothing_of_a_running_job(site, other_namespace):
    be = backend(site)
    gate = site["shared"] / "go"
    spec, jd = start(site, be, LINEAR, STEPS="8", GATE=str(gate))
    wait_step(be, spec, jd, 5)  # held there until the gate opens
    procs = job_processes(jd)
    ports = listening_ports(procs)
    assert ports, "the job listens on nothing: nothing to attack"
    marker = site["shared"] / "pwned"
    target = {
        "job": spec.id,
        "ports": sorted(ports),
        "marker": str(marker),
        "python": sys.executable,
    }

    # Both attackers at once: each mostly waits out timeouts against refused ports.
    ns, host_addr = other_namespace
    attacks = [
        attack_from_account(site, {**target, "hosts": ["127.0.0.1", *host_addresses()]}),
        attack_from_namespace(ns, {**target, "hosts": [host_addr]}),
    ]
    try:
        from_account, from_namespace = (result_of(a) for a in attacks)
    finally:
        for a in attacks:
            if a.poll() is None:
                a.kill()

    print(
        json.dumps({"from an account": from_account, "from a namespace": from_namespace}, indent=1)
    )
    assert_nothing_reached(from_account)
    assert_nothing_reached(from_namespace)
    # The job's agents ran the heartbeats that would have unpickled a planted state.
    assert all(p.is_running() for p in procs[:2])

    gate.touch()
    # A service that restarted (a new backend) watches the job to its end and removes its network.
    again = backend(site)
    status = finish(again, spec)
    assert status.state == "succeeded" and status.restarts == 0, f"{status}\n{logs_of(jd)}"
    assert not marker.exists(), "the attacker's pickle ran as the job's owner"
    assert f"network: {netns_name(spec.id)}" in Path(jd.p("events.log")).read_text()
    assert no_trace_of(spec.id)


def test_the_job_reaches_out_but_not_the_hosts_loopback(site):
    addrs = host_addresses()
    if not addrs:
        pytest.skip("the host has no address but loopback to reach out to")
    servers = [socket.create_server((addrs[0], 0)), socket.create_server(("127.0.0.1", 0))]
    accepted = []

    def accept(server):
        try:
            conn, _ = server.accept()
            accepted.append(server.getsockname())
            conn.close()
        except OSError:
            pass

    threads = [threading.Thread(target=accept, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    be = backend(site)
    spec, jd = start(
        site,
        be,
        REACH_OUT,
        OUT_ADDR=f"{addrs[0]}:{servers[0].getsockname()[1]}",
        HOST_LOOPBACK=f"10.0.2.2:{servers[1].getsockname()[1]}",
    )
    try:
        status = finish(be, spec)
    finally:
        for s in servers:
            s.close()
    rank0 = Path(jd.p("logs", "rank0.log")).read_text()
    assert status.state == "succeeded", f"{status}\n{rank0}"
    assert "OUT_ADDR reached" in rank0 and "HOST_LOOPBACK not reached" in rank0, rank0
    assert no_trace_of(spec.id)


def test_cancel_removes_the_namespace_and_its_outbound(site):
    be = backend(site)
    spec, jd = start(site, be, SLEEPS)
    wait_step(be, spec, jd, 1)
    assert job_network.exists(spec.id) and job_network.outbound_pids(spec.id)
    procs = job_processes(jd)
    asyncio.run(be.cancel(spec))
    assert no_trace_of(spec.id)
    assert not any(_exists(p) for p in procs)


def test_a_failed_job_leaves_no_namespace(site):
    be = backend(site)
    spec, jd = start(site, be, FAILS_ON_RANK_1)
    status = finish(be, spec)
    assert status.state == "failed" and "bad batch shape" in status.message, status
    assert no_trace_of(spec.id)


def test_host_mode_is_the_hosts_network_and_says_so(site):
    be = backend(site, mode="host")
    spec, jd = start(site, be, SLEEPS)
    wait_step(be, spec, jd, 1)
    assert not job_network.exists(spec.id)
    events = Path(jd.p("events.log")).read_text()
    assert 'network: the host\'s (c.JobNetwork.mode = "host"' in events, events
    asyncio.run(be.cancel(spec))


def _exists(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_namespace_that_cannot_be_made_stops_the_start_not_the_separation(monkeypatch):
    """Without its namespace a job would run in the host's network, where every
    account connects to its rendezvous and its ranks: the start fails, saying how to
    choose the host's network knowingly."""

    def refuse(*args):
        raise subprocess.CalledProcessError(1, ["ip", *args], stderr="RTNETLINK: busy")

    monkeypatch.setattr(job_network, "_ip", refuse)
    job_id = f"nons{uuid.uuid4().hex[:6]}"
    with pytest.raises(job_network.JobNetworkError) as refused:
        JobNetwork().open(job_id, separated=True)
    assert "the job's network namespace could not be made" in str(refused.value)
    assert 'c.JobNetwork.mode = "host"' in str(refused.value)
    assert not job_network.exists(job_id)
