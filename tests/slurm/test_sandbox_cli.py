"""`gpulab slurm-sandbox up|down`: the cluster, the config file it writes, and the cleanup."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurmhelpers import needs_slurm
from support.service import running_service
from traitlets.config import Config

from gpulab.backend.slurm_sandbox import load_state

pytestmark = [needs_slurm, pytest.mark.netns]

GPULAB = [sys.executable, "-m", "gpulab.hub_ext.cli"]


def gpulab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPULAB, *args], capture_output=True, text=True, timeout=120)


def netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_up_writes_a_config_gpulab_loads_and_down_removes_it_all(slurm_base):
    data = slurm_base / "cli"
    (data).mkdir()
    (data / "gpulab_config.py").write_text("c.GpuLabService.max_upload_mib = 7\n")
    up = gpulab("slurm-sandbox", "up", "--nodes", "2", "--data-dir", str(data))
    state = load_state(data / "slurm")
    try:
        assert up.returncode == 0, up.stderr
        assert f"gpulab up --data-dir {data}" in up.stdout
        assert state and state["up"]
        # The config file: the operator's line kept, the sandbox's settings added.
        c = Config()
        exec((data / "gpulab_config.py").read_text(), {"c": c, "get_config": lambda: c})
        conf = str(data / "slurm" / "etc" / "slurm.conf")
        assert c.SlurmSite.slurm_conf == conf
        assert c.GpuLabService.jobs_backend_class == "slurm"
        assert c.GpuLabService.max_upload_mib == 7
        # The daemons outlived the command: Slurm answers with both nodes idle.
        sinfo = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env={**os.environ, "SLURM_CONF": conf},
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split("\n")
        assert sorted(line.split()[0] for line in sinfo if line) == sorted(
            n["name"] for n in state["nodes"]
        )
        assert all(line.split()[1] == "idle" for line in sinfo if line)
        # The service started on that data dir (with that file) runs on the sandbox:
        # its GPUs are the nodes' GRES, and jobs can name the slurm backend.
        text = (data / "gpulab_config.py").read_text()
        async with running_service(data / "service", text, simulate="") as svc:
            nodes = {g.node for g in svc.app.gpus}
            assert nodes == {n["name"] for n in state["nodes"]}, svc.app.gpus
            assert len(svc.app.gpus) == 4 and all(g.simulated for g in svc.app.gpus)
            assert "slurm" in svc.app.jobs.backends
        # A second up in the same dir says so instead of starting another cluster.
        again = gpulab("slurm-sandbox", "up", "--nodes", "2", "--data-dir", str(data))
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = gpulab("slurm-sandbox", "down", "--data-dir", str(data))
    assert down.returncode == 0, down.stderr
    assert not (data / "slurm").exists()
    assert (data / "gpulab_config.py").read_text() == "c.GpuLabService.max_upload_mib = 7\n"
    assert not any(n["netns"] in netns() for n in state["nodes"])
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"gsb{state['tag']}" not in links
    assert not any(alive(pid) for pid in state["pids"].values())


def test_up_explains_a_bad_gpu_spec(slurm_base):
    bad = gpulab("slurm-sandbox", "up", "--gpus", "shard:4", "--data-dir", str(slurm_base / "x"))
    assert bad.returncode == 1
    assert "shard needs gpu" in bad.stderr


def test_up_refuses_a_data_dir_too_long_for_slurms_sockets(slurm_base):
    long_dir = slurm_base / ("d" * 60)
    up = gpulab("slurm-sandbox", "up", "--nodes", "2", "--data-dir", str(long_dir))
    assert up.returncode == 1
    assert "--data-dir: the data dir" in up.stderr and "e.g. /var/tmp/gpulab-slurm" in up.stderr
    assert "Traceback" not in up.stderr and not long_dir.exists()
