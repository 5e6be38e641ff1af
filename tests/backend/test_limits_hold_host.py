"""Limits that hold the host: processes per group, a user's quota over all their groups.

Live on this host's real cgroups (v1 here, with a pids hierarchy; root in CI), as
``test_cgroups.py``; the pure parts always run.
"""

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.cgroups import Cgroups
from gpulab.enforcement.cgroups_systemd import slice_dropin, systemd_properties
from gpulab.enforcement.limits import (
    GIB,
    MIB,
    Limits,
    capped,
    cpu_shares,
    cpu_weight,
    format_limits,
    host_user_quota,
)

# -- pure -----------------------------------------------------------------------------


def test_a_job_node_asks_no_more_than_the_users_quota():
    limits = AccountLimits(cpu_per_gpu=8, memory_per_gpu=64 * GIB, cpu_floor=1)
    limits.memory_floor = 2 * GIB
    # 8 CPU-only ranks: 8 cores and 16 GiB by the floors...
    assert limits.limits(0, 1, ranks=8) == Limits(8.0, 16 * GIB, None, 4096)
    # ...but the user's quota is 2 cores and 10 GiB: that is what the node's group gets.
    limits.quota_cpu, limits.quota_memory = 2.0, 10 * GIB
    assert limits.limits(0, 1, ranks=8) == Limits(2.0, 10 * GIB, None, 4096)
    assert limits.limits(0, 1, ranks=1) == Limits(1.0, 2 * GIB, None, 4096)
    assert limits.quota() == Limits(2.0, 10 * GIB, None)
    # A host without GPUs has no per-GPU share: unlimited becomes the quota.
    assert capped(Limits(None, None, ()), 2.0, 10 * GIB) == Limits(2.0, 10 * GIB, ())
    assert capped(Limits(4.0, GIB, None, 7), 0, 0) == Limits(4.0, GIB, None, 7)


def test_the_default_quota_is_the_hosts_cores_and_memory_less_a_tenth():
    assert host_user_quota(2, 23 * GIB) == (2.0, 23 * GIB - 23 * GIB // 10)
    assert host_user_quota(0, 10 * GIB) == (1.0, 9 * GIB)


def test_the_process_cap_is_said_and_set_by_every_mechanism():
    assert format_limits(Limits(2.0, 8 * GIB, None, 4096)) == (
        "2 CPUs, 8 GiB, devices not limited, 4096 processes"
    )
    assert systemd_properties(Limits(None, None, None, 512), {}, []) == ["TasksMax=512"]
    assert slice_dropin(Limits(2.0, 10 * GIB, None, 8192)).splitlines()[1:] == [
        "[Slice]",
        "CPUQuota=200%",
        f"MemoryMax={10 * GIB}",
        "MemorySwapMax=0",
        "TasksMax=8192",
    ]
    assert AccountLimits(pids_max=0).limits(0, 1).pids is None
    with pytest.raises(ValueError, match="pids must be 1 or more"):
        Limits(None, None, None, 0)


# -- live -----------------------------------------------------------------------------


@pytest.fixture
def cgroups():
    if os.geteuid() != 0:
        pytest.skip("cgroup limits need root (CI runs as root)")
    cg = Cgroups.detect(gpu_nodes=["/dev/null", "/dev/zero"])
    if cg.kind in ("none", "systemd"):
        pytest.skip(f"these tests drive the cgroup filesystem; this host offers {cg.describe()}")
    account = f"test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    made = []

    def create(unit: str, limits: Limits):
        group = cg.create(f"{account}/{unit}", limits)
        made.append(group)
        return group

    yield cg, account, create
    for group in made:
        group.remove()


FORK_UNTIL_REFUSED = textwrap.dedent("""\
    import os, signal, time
    kids = []
    try:
        for _ in range(500):
            pid = os.fork()
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            kids.append(pid)
        print("forked", len(kids))
    except BlockingIOError as exc:
        print("refused after", len(kids), exc.errno == __import__("errno").EAGAIN)
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    """)


def test_a_fork_bomb_gets_eagain_at_the_groups_process_cap(cgroups):
    cg, _, create = cgroups
    if cg.kind == "cgroup1" and "pids" not in cg.bases:
        pytest.skip("this host has no pids hierarchy mounted")
    group = create("server", Limits(None, None, None, pids=20))
    argv, kwargs = group.launch([sys.executable, "-c", FORK_UNTIL_REFUSED], user=65534, group=65534)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    assert done.returncode == 0, done.stderr
    # The process itself is the 20th: 19 children, then EAGAIN (BlockingIOError).
    assert done.stdout.strip() == "refused after 19 True"
    assert group.describe().endswith(", 20 processes")
    # The host is fine: outside the group a process forks as before.
    outside = subprocess.run(
        [sys.executable, "-c", FORK_UNTIL_REFUSED.replace("range(500)", "range(40)")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outside.stdout.strip() == "forked 40"


def test_an_accounts_groups_are_held_together_to_its_quota(cgroups):
    cg, account, create = cgroups
    if cg.kind != "cgroup1":
        pytest.skip(f"the CFS and memory files read here are cgroup v1's; this host has {cg.label}")
    assert cg.hold(account, Limits(0.5, 256 * MIB, None, 100)) == []
    one = create("job-1-node0", Limits(0.5, 200 * MIB, None, 50))
    # v1 refuses a child a CPU quota above its parent's: it gets the account's, and says so.
    two = create("job-2-node0", Limits(2.0, 200 * MIB, None, 50))
    assert "CPU held at the account's quota of 0.5" in two.describe()
    base = {c: os.path.join(b, account) for c, b in cg.bases.items()}

    def read(controller, name):
        with open(os.path.join(base[controller], name)) as f:
            return f.read().strip()

    assert read("cpu", "cpu.cfs_quota_us") == "50000"
    assert read("memory", "memory.limit_in_bytes") == str(256 * MIB)
    assert read("pids", "pids.max") == "100"
    with open(os.path.join(two.dirs[0], "cpu.cfs_quota_us")) as f:
        assert f.read().strip() == "50000"
    # 150 MiB fits either group on its own (200 MiB each); both at once are 300 MiB,
    # over the account's 256: the kernel holds the two together (its OOM killer ends
    # one of them, the larger in the account, which may be the one already running).
    hog = "b = b'x' * (150 << 20); import time; print('ok', flush=True); time.sleep({})"
    argv, kwargs = two.launch([sys.executable, "-c", hog.format(0)])
    alone = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    assert alone.returncode == 0 and alone.stdout.strip() == "ok", alone
    argv, kwargs = one.launch([sys.executable, "-c", hog.format(60)])
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **kwargs)
    assert first.stdout.readline().strip() == "ok"
    argv, kwargs = two.launch([sys.executable, "-c", hog.format(0)])
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)
    first_ended = first.poll()
    first.kill()
    first.wait()
    first.stdout.close()
    # What the kernel counted for the account, its two groups together, never went
    # over the account's limit (without that limit the peak is the sum, ~320 MiB).
    peak = int(read("memory", "memory.max_usage_in_bytes"))
    assert peak <= 256 * MIB, (peak, first_ended, second)


def test_a_groups_cpu_weight_is_in_proportion_to_its_cores():
    # The default (1024 for any group) weighs a 2-rank job as one process.
    assert (cpu_shares(1), cpu_shares(2), cpu_shares(0.5), cpu_shares(0.001)) == (
        1024,
        2048,
        512,
        2,
    )
    assert (cpu_weight(1), cpu_weight(2), cpu_weight(0.25), cpu_weight(500)) == (
        100,
        200,
        25,
        10000,
    )


def test_a_two_rank_job_weighs_as_two_processes_and_gpulab_as_the_host(cgroups):
    """Under contention a 2-rank job must get what 2 ranks outside any group get: on a
    host that groups tasks by session (autogroup), each torchrun rank weighs 1024."""
    cg, account, create = cgroups
    if cg.kind != "cgroup1":
        pytest.skip(f"the cpu.shares read here are cgroup v1's; this host has {cg.label}")
    node = create("job-1-node0", Limits(2.0, 512 * MIB, None, 100))

    def shares(d):
        with open(os.path.join(d, "cpu.shares")) as f:
            return int(f.read())

    host = 1024 * (os.cpu_count() or 1)
    assert shares(node.dirs[0]) == 2048
    assert shares(os.path.dirname(node.dirs[0])) == host  # the account, made on the way
    assert shares(cg.bases["cpu"]) == host  # gpulab's whole tree
    # An account held to a quota weighs as its quota.
    assert cg.hold(account, Limits(3.0, 1024 * MIB, None, 200)) == []
    assert shares(os.path.dirname(node.dirs[0])) == 3072


def test_a_group_the_host_fails_to_make_stops_the_work_from_starting(monkeypatch):
    """On a host that holds groups, a group that could not be made ran the work with no
    limits and every GPU of the host (its device rule is the group's); it is refused."""
    from gpulab.enforcement.account_limits import LimitsNotHeld
    from gpulab.enforcement.cgroups import CgroupError

    class Failing(Cgroups):
        def create(self, name, limits):
            raise CgroupError("cpu.max: No space left on device")

    limits = AccountLimits(cpu_per_gpu=2, memory_per_gpu=8 * GIB)
    monkeypatch.setattr(limits, "cgroups", lambda: Failing())
    with pytest.raises(LimitsNotHeld, match="could not hold job-1-node0 of gpulab-alice"):
        limits.group("gpulab-alice", "job-1-node0", 250, 4)
    # A host with no way to hold groups at all still runs the work, and says so.
    monkeypatch.setattr(limits, "cgroups", lambda: Cgroups("not root"))
    group = limits.group("gpulab-alice", "job-1-node0", 250, 4)
    assert group.describe() == "not enforced: not root"
