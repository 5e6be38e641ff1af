"""CPU, memory and device limits held by the kernel, on this host's real cgroups.

The live tests need root and a writable cgroup filesystem (CI has both: PID 1
is not systemd here, so groups are cgroup v1 directories); elsewhere they are
skipped and say why. The parsers and the systemd command line are pure and
always run.
"""

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from gpulab.enforcement.cgroups import (
    Cgroups,
    cgroup_dir,
    group_path,
    parse_cgroup_mounts,
    parse_proc_cgroup,
)
from gpulab.enforcement.cgroups_systemd import (
    SystemdCgroups,
    SystemdGroup,
    systemd_properties,
    systemd_units,
    unit_escape,
)
from gpulab.enforcement.gpu_nodes import DeviceNode
from gpulab.enforcement.limits import GIB, MIB, Limits

# -- pure -----------------------------------------------------------------------------

MOUNTINFO = textwrap.dedent("""\
    24 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
    31 24 0:26 / /sys/fs/cgroup rw shared:9 - tmpfs tmpfs rw,mode=755
    32 31 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:10 - cgroup cgroup rw,cpu,cpuacct
    33 31 0:28 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory
    34 31 0:29 /docker/abc /sys/fs/cgroup/devices rw shared:12 - cgroup cgroup rw,devices
    35 31 0:30 / /sys/fs/cgroup/systemd rw shared:13 - cgroup cgroup rw,xattr,name=systemd
    36 31 0:31 / /sys/fs/cgroup/unified rw shared:14 - cgroup2 cgroup2 rw,nsdelegate
    """)

PROC_CGROUP = textwrap.dedent("""\
    12:name=systemd:/
    5:devices:/docker/abc/inner
    4:memory:/process_api/024af
    2:cpu,cpuacct:/
    0::/hub.scope
    """)


def test_mounts_and_own_cgroups_are_read_from_proc():
    v1, v2 = parse_cgroup_mounts(MOUNTINFO)
    assert v1 == {
        "cpu": ("/sys/fs/cgroup/cpu,cpuacct", "/"),
        "cpuacct": ("/sys/fs/cgroup/cpu,cpuacct", "/"),
        "memory": ("/sys/fs/cgroup/memory", "/"),
        "devices": ("/sys/fs/cgroup/devices", "/docker/abc"),
    }
    assert v2 == ("/sys/fs/cgroup/unified", "/")
    own, unified = parse_proc_cgroup(PROC_CGROUP)
    assert own == {
        "devices": "/docker/abc/inner",
        "memory": "/process_api/024af",
        "cpu": "/",
        "cpuacct": "/",
    }
    assert unified == "/hub.scope"
    # A bind mount of a sub-tree: the process's path is taken relative to it.
    assert (
        cgroup_dir("/sys/fs/cgroup/devices", "/docker/abc", "/docker/abc/inner")
        == "/sys/fs/cgroup/devices/inner"
    )
    assert (
        cgroup_dir("/sys/fs/cgroup/memory", "/", "/process_api/024af")
        == "/sys/fs/cgroup/memory/process_api/024af"
    )
    assert cgroup_dir("/sys/fs/cgroup/cpu", "/", "/") == "/sys/fs/cgroup/cpu"


def test_group_and_unit_names_are_escaped():
    assert group_path("gpulab-alice/server") == "gpulab-alice/server"
    assert group_path("bob smith/../job 3") == "bob%20smith/%2E%2E/job%203"
    assert unit_escape("gpulab-alice") == "gpulab\\x2dalice"
    assert systemd_units("gpulab", "gpulab-alice/job-7") == (
        "gpulab-gpulab\\x2dalice.slice",
        "gpulab-gpulab\\x2dalice-job\\x2d7.scope",
    )
    with pytest.raises(ValueError, match="alice/server"):
        group_path("/")


def test_systemd_scope_properties_allow_all_devices_but_other_cards():
    host = [
        DeviceNode("c", 195, 0, "/dev/nvidia0"),
        DeviceNode("c", 195, 1, "/dev/nvidia1"),
        DeviceNode("c", 195, 255, "/dev/nvidiactl", shared=True),
        DeviceNode("c", 509, 0, "/dev/nvidia-uvm", shared=True),
    ]
    majors = {"mem": 1, "pts": 136, "nvidia-frontend": 195, "nvidia-uvm": 509}
    assert systemd_properties(Limits(2.5, 16 * GIB, ("/dev/nvidia0",)), majors, host) == [
        "CPUQuota=250%",
        f"MemoryMax={16 * GIB}",
        "MemorySwapMax=0",
        "DevicePolicy=closed",
        "DeviceAllow=char-mem rwm",
        "DeviceAllow=char-pts rwm",
        "DeviceAllow=char-nvidia-uvm rwm",
        "DeviceAllow=/dev/nvidia0 rw",
        "DeviceAllow=/dev/nvidiactl rw",
    ]
    # No GPU: the control nodes go too; no device rule at all on simulated GPUs.
    assert systemd_properties(Limits(1.0, 2 * GIB, ()), majors, host) == [
        "CPUQuota=100%",
        f"MemoryMax={2 * GIB}",
        "MemorySwapMax=0",
        "DevicePolicy=closed",
        "DeviceAllow=char-mem rwm",
        "DeviceAllow=char-pts rwm",
    ]
    assert systemd_properties(Limits(None, None, None), majors, host) == []


def test_under_systemd_the_command_runs_in_a_scope_and_drops_to_the_user_there():
    cg = SystemdCgroups(gpu_nodes=[])
    group = SystemdGroup(
        cg,
        "gpulab-alice/server",
        Limits(2.0, 8 * GIB, None),
        ["CPUQuota=200%", f"MemoryMax={8 * GIB}", "MemorySwapMax=0"],
    )
    argv, kwargs = group.launch(
        ["jupyterhub-singleuser", "--port=8888"], user=1001, group=1001, extra_groups=[100]
    )
    # Full paths, from the hub's own PATH: the command starts as root with the server's
    # environment, whose PATH begins with folders its user writes (their own env's bin).
    assert argv[0] == shutil.which("systemd-run") and os.path.isabs(argv[0])
    assert argv[11] == shutil.which("setpriv") and os.path.isabs(argv[11])
    assert argv == [
        shutil.which("systemd-run"),
        "--scope",
        "--quiet",
        "--collect",
        "--unit=gpulab-gpulab\\x2dalice-server.scope",
        "--slice=gpulab-gpulab\\x2dalice.slice",
        "--description=gpulab gpulab-alice/server",
        "--property=CPUQuota=200%",
        f"--property=MemoryMax={8 * GIB}",
        "--property=MemorySwapMax=0",
        "--",
        shutil.which("setpriv"),
        "--reuid=1001",
        "--regid=1001",
        "--groups=100",
        "--",
        "jupyterhub-singleuser",
        "--port=8888",
    ]
    # systemd-run must start as root; nothing else runs in the child before it.
    assert kwargs == {}
    assert group.describe() == "systemd: 2 CPUs, 8 GiB, devices not limited"


def test_a_host_without_the_means_says_so_and_launches_plainly():
    cg = Cgroups.detect(mechanism="none")
    assert cg.kind == "none"
    assert cg.describe(Limits(1.0, GIB, ())) == "not enforced: switched off by configuration"
    group = cg.create("alice/server", Limits(1.0, GIB, ()))
    assert group.describe() == "not enforced: switched off by configuration"
    assert group.launch(["true"], user=1000, group=1000) == (
        ["true"],
        {"user": 1000, "group": 1000},
    )
    assert group.remove()
    with pytest.raises(ValueError, match="choose auto"):
        Cgroups.detect(mechanism="lxc")


# -- live -----------------------------------------------------------------------------


def _live() -> Cgroups:
    if os.geteuid() != 0:
        pytest.skip("cgroup limits need root (CI runs as root)")
    if not os.path.isdir("/sys/fs/cgroup"):
        pytest.skip("no cgroup filesystem at /sys/fs/cgroup")
    # /dev/null (char 1:3) and /dev/zero (1:5) stand in for /dev/nvidia1 and /dev/nvidia0:
    # the device rule is the same, this host has no GPU.
    cg = Cgroups.detect(gpu_nodes=["/dev/null", "/dev/zero"])
    if cg.kind in ("none", "systemd"):
        pytest.skip(f"these tests drive the cgroup filesystem; this host offers {cg.describe()}")
    return cg


@pytest.fixture
def cgroups():
    cg = _live()
    made = []

    def create(unit: str, limits: Limits):
        group = cg.create(f"test-{os.getpid()}-{uuid.uuid4().hex[:6]}/{unit}", limits)
        made.append(group)
        return group

    yield cg, create
    for group in made:
        group.remove()


def _run(group, code: str, timeout: float = 60, **launch):
    argv, kwargs = group.launch([sys.executable, "-c", code], **launch)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


ALLOCATE_256_MIB = "b = b'x' * (256 << 20); print('allocated', len(b) >> 20, 'MiB')"


def test_a_64_mib_group_stops_a_256_mib_allocation(cgroups):
    _, create = cgroups
    capped = create("small", Limits(None, 64 * MIB, None))
    done = _run(capped, ALLOCATE_256_MIB)
    # The kernel's OOM killer ends it (SIGKILL), or the allocation fails in Python.
    assert done.returncode == -9 or "MemoryError" in done.stderr, (done.returncode, done.stderr)
    assert "allocated" not in done.stdout
    free = create("free", Limits(None, None, None))
    done = _run(free, ALLOCATE_256_MIB)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "allocated 256 MiB"


def test_a_fifth_of_a_core_throttles_a_busy_loop(cgroups):
    _, create = cgroups
    group = create("busy", Limits(0.2, None, None))

    # 0.4 s of CPU time, not of wall time: at 0.2 cores that spans at least 2 s of
    # 100 ms periods, however busy the machine is (a wall-clock loop on a loaded
    # machine may barely reach the quota). On a machine so busy that the loop never
    # got a fifth of a core in any period the kernel had nothing to throttle: it
    # runs again, up to three times. (A period throttled just as it ended counts in
    # nr_throttled with no throttled time: seen once here, under load.)
    def throttled(stat) -> int:
        return stat.get("throttled_time", stat.get("throttled_usec", 0))

    for _ in range(3):
        done = _run(group, "import time\nwhile time.process_time() < 0.4: pass")
        assert done.returncode == 0, done.stderr
        stat = group.cpu_stat()
        if stat["nr_throttled"] > 0 and throttled(stat) > 0:
            break
    # The kernel's own count, not a stopwatch: each throttled period is one.
    assert stat["nr_throttled"] > 0, stat
    assert throttled(stat) > 0, stat


def test_devices_outside_the_slice_cannot_be_opened(cgroups):
    cg, create = cgroups
    if cg.kind != "cgroup1":
        pytest.skip(f"device rules are held by cgroup v1 or systemd; this host has {cg.label}")
    # The slice holds "/dev/zero" (standing in for /dev/nvidia0); "/dev/null" is the
    # other card (/dev/nvidia1). Editing CUDA_VISIBLE_DEVICES does not reach it.
    group = create("devices", Limits(None, None, ("/dev/zero",)))
    probe = textwrap.dedent("""\
        import errno
        open("/dev/zero", "rb").read(1)
        try:
            open("/dev/null", "rb")
        except PermissionError as exc:
            print("denied", errno.errorcode[exc.errno])
        else:
            print("opened")
        """)
    done = _run(group, probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "denied EPERM"
    assert group.describe() == "cgroup v1: CPU not limited, memory not limited, devices: /dev/zero"
    # Created again for a slice that holds both: the earlier denial is lifted.
    again = cg.create(group.name, Limits(None, None, ("/dev/zero", "/dev/null")))
    assert _run(again, probe).stdout.strip() == "opened"


def test_the_child_joins_before_dropping_privileges_and_cannot_leave(cgroups):
    cg, create = cgroups
    group = create("server", Limits(1.0, 256 * MIB, ()))
    probe = textwrap.dedent("""\
        import os
        print(os.getuid(), os.getgid(), os.getgroups())
        print(open("/proc/self/cgroup").read().strip().replace("\\n", ";"))
        try:
            with open(os.environ["PARENT_PROCS"], "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            print("stays", exc.errno)
        """)
    parent_procs = os.path.join(os.path.dirname(group.dirs[0]), "cgroup.procs")
    argv, kwargs = group.launch(
        [sys.executable, "-c", probe], user=65534, group=65534, extra_groups=[]
    )
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PARENT_PROCS": parent_procs},
        **kwargs,
    )
    assert done.returncode == 0, done.stderr
    ids, cgroup_lines, left = done.stdout.strip().split("\n")
    assert ids == "65534 65534 []"
    assert f"/gpulab/{group_path(group.name)}" in cgroup_lines
    assert left == f"stays {errno.EACCES}"


def test_groups_are_removed_with_their_empty_parents(cgroups):
    cg, create = cgroups
    first = create("server", Limits(0.5, 128 * MIB, None))
    account_dirs = {os.path.dirname(d) for d in first.dirs}
    sibling = cg.create(os.path.dirname(first.name) + "/job-1", Limits(0.5, None, None))
    # A straggler that left the process group is killed with the group.
    argv, kwargs = first.launch([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
    assert first.pids() == [proc.pid]
    assert first.remove()
    assert proc.wait(timeout=10) == -9
    assert not any(os.path.exists(d) for d in first.dirs)
    assert all(os.path.isdir(d) for d in account_dirs)  # job-1 still lives there
    assert sibling.remove()
    assert not any(os.path.exists(d) for d in account_dirs)
    assert all(os.path.isdir(b) for b in cg.bases.values())
    # Removing again, or opening a group that is gone, is harmless.
    assert first.remove()
    assert cg.open(first.name).remove()
