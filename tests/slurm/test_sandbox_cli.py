"""`gpulab slurm-sandbox up|down`: the cluster, the config file it writes, and the cleanup."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurmhelpers import needs_slurm
from support.service import running_service
from traitlets.config import Config

from gpulab.backend.slurm_sandbox import load_state
from gpulab.hub_ext import slurm_cli

BOX = {"name": "box", "inventory": "local", "jobs": "local", "serving": "local"}
SLURM = {"name": "slurm", "inventory": "slurm", "jobs": "slurm"}

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


def load_config(path: Path) -> Config:
    c = Config()
    exec(path.read_text(), {"c": c, "get_config": lambda: c})
    return c


@needs_slurm
@pytest.mark.netns
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
        c = load_config(data / "gpulab_config.py")
        conf = str(data / "slurm" / "etc" / "slurm.conf")
        assert c.SlurmSite.slurm_conf == conf
        assert c.GpuLabService.jobs_backend_class == "slurm"
        assert c.GpuLabService.max_upload_mib == 7
        # Without --hybrid the site is the cluster alone: no pools, no box.
        assert "pools" not in c.InventorySettings and "--simulate-gpus" not in up.stdout
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
        # (--hybrid too: the flag is parsed before the refusal.)
        again = gpulab("slurm-sandbox", "up", "--hybrid", "--nodes", "2", "--data-dir", str(data))
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


@needs_slurm
@pytest.mark.netns
def test_up_explains_a_bad_gpu_spec(slurm_base):
    bad = gpulab("slurm-sandbox", "up", "--gpus", "shard:4", "--data-dir", str(slurm_base / "x"))
    assert bad.returncode == 1
    assert "shard needs gpu" in bad.stderr


@needs_slurm
@pytest.mark.netns
def test_up_refuses_a_data_dir_too_long_for_slurms_sockets(slurm_base):
    long_dir = slurm_base / ("d" * 60)
    up = gpulab("slurm-sandbox", "up", "--nodes", "2", "--data-dir", str(long_dir))
    assert up.returncode == 1
    assert "--data-dir: the data dir" in up.stderr and "e.g. /var/tmp/gpulab-slurm" in up.stderr
    assert "Traceback" not in up.stderr and not long_dir.exists()


def fake_state(data: Path) -> dict:
    """What ``slurm_sandbox.start`` returns, for the config's tests (no cluster)."""
    return {
        "data_dir": str(data / "slurm"),
        "cluster": "gsbtest",
        "ctl_addr": "10.99.0.1",
        "ctl_port": 6817,
        "nodes": [{"name": f"gsbtest-n{i}", "addr": f"10.99.0.{i + 2}"} for i in range(2)],
        "start_seconds": 0.1,
        "up": True,
    }


@pytest.mark.parametrize("spawner", [False, True])
def test_hybrid_config_is_two_pools_box_first(tmp_path, spawner):
    text = slurm_cli.config_text({**fake_state(tmp_path), "spawner": spawner}, hybrid=True)
    path = tmp_path / "gpulab_config.py"
    path.write_text(text)
    c = load_config(path)
    assert c.InventorySettings.pools == [BOX, SLURM]
    # Each pool names its inventory and backend: no single-backend settings beside them.
    assert "jobs_backend_class" not in c.GpuLabService
    assert "inventory_class" not in c.InventorySettings
    assert c.SlurmSite.slurm_conf == str(tmp_path / "slurm" / "etc" / "slurm.conf")
    assert c.SlurmInventory.simulated is True
    assert (c.JupyterHub.spawner_class == "gpulab-slurm") is spawner
    # Servers started as Slurm jobs take their slices in the Slurm pool; else the box's.
    assert c.InventorySettings.get("server_pool", "") == ("slurm" if spawner else "")
    # The non-hybrid text is unchanged by the flag's existence.
    plain = slurm_cli.config_text(fake_state(tmp_path))
    assert "pools" not in plain and 'jobs_backend_class = "slurm"' in plain


def test_up_hybrid_writes_the_pools_and_says_how_to_start_the_box(tmp_path, monkeypatch, capsys):
    """``up --hybrid`` end to end in this process, with the cluster's start stood in
    for (the live test above starts a real one): the file it writes and what it prints."""
    data = tmp_path / "site"
    state = fake_state(data)
    monkeypatch.setattr(slurm_cli, "_preflight", lambda: None)
    # No cluster starts, so no socket goes under the (pytest-long) data dir.
    monkeypatch.setattr(slurm_cli.slurm_sandbox, "check_socket_room", lambda *a: None)
    monkeypatch.setattr(slurm_cli.slurm_sandbox, "start", lambda *a, **k: state)
    monkeypatch.setattr(
        slurm_cli.slurm_sandbox, "env", lambda d: {"SLURM_CONF": str(d / "etc" / "slurm.conf")}
    )
    parser = argparse.ArgumentParser()
    slurm_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["slurm-sandbox", "up", "--hybrid", "--data-dir", str(data)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"gpulab up --data-dir {data} --simulate-gpus {slurm_cli.HYBRID_BOX_GPUS}" in out
    assert load_config(data / "gpulab_config.py").InventorySettings.pools == [BOX, SLURM]


def test_hybrid_is_in_the_help():
    helptext = gpulab("slurm-sandbox", "up", "--help").stdout
    assert "--hybrid" in helptext and "--simulate-gpus" in helptext
