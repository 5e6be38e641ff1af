"""The throwaway Slurm cluster: munged, slurmctld and two slurmd, each slurmd in
its own network namespace, all under one data dir; ``srun -N2 hostname`` runs on
both nodes, and ``stop`` leaves no daemon, namespace or link behind.

Real Slurm (Debian ``slurm-wlm``) and munge, real namespaces; skipped without
root or without the packages. The GPUs are simulated GRES (no GPU here).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from support.wait import wait_until

from gpulab.backend import slurm_sandbox

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def own_processes(data_dir):
    """Live processes whose command line names the data dir."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(data_dir) in cmd:
            found.append(f"{pid} {cmd}")
    return found


def running_sleeps(state):
    """`sleep 300` processes inside the node namespaces."""
    count = 0
    for n in state["nodes"]:
        pids = subprocess.run(["ip", "netns", "pids", n["netns"]], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            count += cmd[:2] == [b"/usr/bin/sleep", b"300"] or cmd[:2] == [b"sleep", b"300"]
    return count


def netns_list():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def links():
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


@pytest.fixture
def short_dir():
    """Slurm's step sockets live under the data dir: pytest's tmp_path (longer still
    under pytest-xdist) leaves them too little of a socket path's 108 bytes."""
    path = tempfile.mkdtemp(prefix="gpulab-sb-", dir="/var/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def needs_root_and_slurm():
    if os.geteuid() != 0:
        pytest.skip("the Slurm sandbox needs root (namespaces, daemons)")
    if not (shutil.which("slurmctld") and shutil.which("munged")):
        pytest.skip("apt-get install -y slurm-wlm munge")


def test_a_data_dir_too_long_for_slurms_sockets_is_refused_before_anything_starts(short_dir):
    needs_root_and_slurm()
    data = short_dir / ("d" * 60)
    before = netns_list()
    with pytest.raises(ValueError, match="at most [0-9]+ characters, e.g. /var/tmp/gpulab-slurm"):
        slurm_sandbox.start(data, nodes=2)
    assert not data.exists() and netns_list() == before


def test_two_namespace_nodes_run_srun_and_stop_leaves_nothing(short_dir):
    needs_root_and_slurm()
    data = short_dir / "slurm"
    try:
        state = slurm_sandbox.start(data, nodes=2, gpus_spec="gpu:2,shard:8")
        # A second start finds it up and changes nothing.
        assert slurm_sandbox.start(data, nodes=2, gpus_spec="gpu:2,shard:8") == state
        names = sorted(n["name"] for n in state["nodes"])
        env = {**os.environ, **slurm_sandbox.env(data)}

        def slurm(*argv):
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert sorted(slurm("srun", "-N2", "hostname").split()) == names
        # Each task ran in its node's namespace: it sees that node's address and link.
        seen = slurm(
            "srun", "-N2", "sh", "-c", "echo $(hostname) $(hostname -I) $(ls /sys/class/net)"
        )
        assert sorted(seen.splitlines()) == sorted(
            f"{n['name']} {n['addr']} {n['peer']} lo" for n in state["nodes"]
        )
        nodes = slurm("scontrol", "show", "node")
        assert nodes.count("Gres=gpu:2,shard:8") == 2, nodes
        cvd = slurm("srun", "-N1", "--gres=gpu:1", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
        assert cvd.strip() == "0"

        # A 2-node batch job whose srun runs on both nodes; scancel ends it everywhere.
        job = slurm("sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "srun sleep 300")
        job = job.strip()
        wait_until(lambda: running_sleeps(state) == 2, "sleep running on both nodes", timeout=60)
        assert slurm("squeue", "-h", "-j", job, "-o", "%T %D").split() == ["RUNNING", "2"]
        slurm("scancel", job)
        wait_until(lambda: running_sleeps(state) == 0, "no sleep left after scancel", timeout=60)
        # After COMPLETING (the steps' ends reported) the job leaves the queue.
        wait_until(
            lambda: job not in slurm("squeue", "-h", "-o", "%i").split(),
            "cancelled job gone from squeue",
            timeout=60,
        )
        assert "CANCELLED" in slurm("scontrol", "show", "job", job)
    finally:
        slurm_sandbox.stop(data)
    assert not (data / "state.json").exists()
    assert own_processes(data) == []
    for n in state["nodes"]:
        assert n["netns"] not in netns_list()
        assert n["veth"] not in links()
    assert state["bridge"] not in links()
    slurm_sandbox.stop(data)  # a second stop is a no-op
