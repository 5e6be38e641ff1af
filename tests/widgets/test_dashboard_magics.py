"""The all-reduce probe under real torchrun, and the `%gpulab` subcommands end to end:
``nettest --nodes`` jobs on the session's shared hub (real ranks, c10d rendezvous),
``dashboard`` against the real service in this process (tests/widgets/conftest.py)."""

import asyncio
import json
import math
import re
import subprocess
import sys

import cloudpickle
import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpulab.client import Client
from gpulab.training.allreduce_probe import RESULT_PREFIX, bus_factor, parse_size

pytestmark = pytest.mark.slow  # real torchrun ranks


def torchrun(nproc, *args, timeout=300):
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "gpulab.training.allreduce_probe",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("nproc", [2, 3])
def test_probe_reports_nccl_tests_bandwidths(nproc, tmp_path):
    out = tmp_path / "r.json"
    p = torchrun(nproc, "--size", "64K,1M", "--iters", "5", "--warmup", "2", "--json-out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    results = json.loads(out.read_text())
    printed = [
        json.loads(line[len(RESULT_PREFIX) :])
        for line in p.stdout.splitlines()
        if line.startswith(RESULT_PREFIX)
    ]
    assert printed == results  # rank 0 only, once per size
    assert [r["size_bytes"] for r in results] == [65536, 2**20]
    for r in results:
        assert r["world_size"] == nproc and r["backend"] == "gloo" and r["iters"] == 5
        assert r["time_s"] > 0
        # nccl-tests: algbw = size / time; busbw = algbw * 2(n-1)/n.
        assert math.isclose(r["algbw_bytes_per_second"], r["size_bytes"] / r["time_s"])
        assert math.isclose(
            r["busbw_bytes_per_second"], r["algbw_bytes_per_second"] * 2 * (nproc - 1) / nproc
        )
    assert bus_factor(3) == pytest.approx(4 / 3)


def test_probe_refuses_to_run_outside_torchrun():
    p = subprocess.run(
        [sys.executable, "-m", "gpulab.training.allreduce_probe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "torchrun" in p.stderr
    assert parse_size("64K") == 65536 and parse_size("1M") == 2**20
    with pytest.raises(ValueError, match="expected bytes"):
        parse_size("lots")


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub: the probe jobs run there; alice and bob need no server."""
    return plain_hub


@pytest.fixture(scope="module")
def tokens(hub, names):
    """alice's and bob's API tokens on the shared hub."""
    return {who: hub.create_user(names[who]) for who in ("alice", "bob")}


@pytest.fixture(scope="module")
def clients(hub, tokens):
    return {name: Client(hub.api, token=token) for name, token in tokens.items()}


def magics_shell(monkeypatch, api, token):
    """An IPython shell with the environment a gpulab server gives alice's kernel."""
    monkeypatch.setenv("GPULAB_API_URL", api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    return ip


@pytest.fixture
def shell(hub, tokens, monkeypatch):
    return magics_shell(monkeypatch, hub.api, tokens["alice"])


def test_nettest_magic_measures_here_and_leaves_recording_to_jobs(shell, clients, names, capsys):
    shell.run_line_magic("gpulab", "nettest --size 256K --iters 5 --nproc 2")
    out = capsys.readouterr().out
    assert "busbw" in out and "algbw * 1.000" in out, out
    # Only a probe that ran as a job is recorded (the service reads it from the job).
    assert "not recorded: a probe on this server alone" in out and "--nodes 1" in out, out
    assert not [
        r
        for r in clients["alice"].telemetry()["allreduce"]
        if r["user"] == names["alice"] and not r.get("job_id")
    ]


@pytest.mark.parametrize("nproc", [1, 2])
def test_nettest_across_nodes_runs_as_a_job_and_records(nproc, shell, clients, names, capsys):
    # nodes=2: two torchrun agents (c10d rendezvous) of a job through the service.
    shell.run_line_magic("gpulab", f"nettest --nodes 2 --nproc {nproc} --size 256K --iters 5")
    out = capsys.readouterr().out
    print(out)  # the figures, for whoever reads the test log
    n = 2 * nproc
    m = re.search(
        rf"^job (\w+) \(nettest\): 2 nodes x {nproc} ranks? per node, no GPU per rank",
        out,
        re.M,
    )
    assert m, out
    assert f"over {n} ranks on 2 nodes" in out and "recorded" in out, out
    job = clients["alice"].get_job(m.group(1))
    assert job["name"] == "nettest" and job["state"] == "succeeded" and job["nodes"] == 2
    assert job["user"] == names["alice"] and job["world_size"] == n
    value = cloudpickle.loads(clients["alice"].job_output(job["id"]))  # rank 0's result
    runs = [
        r
        for r in clients["alice"].telemetry()["allreduce"]
        if r["user"] == names["alice"] and r["world_size"] == n and len(r["nodes"]) == 2
    ]
    assert runs, out
    run = runs[-1]
    assert run["size_bytes"] == 262144 and run["backend"] == "gloo"
    assert run["job_id"] == job["id"]  # the Network tab can say which job measured it
    # nccl-tests: busbw = algbw * 2(n-1)/n (1 for 2 ranks, 1.5 for 4).
    assert run["busbw_bytes_per_second"] == pytest.approx(
        run["algbw_bytes_per_second"] * 2 * (n - 1) / n
    )
    assert f"algbw * {2 * (n - 1) / n:.3f}" in out
    assert {
        k: run[k]
        for k in ("busbw_bytes_per_second", "algbw_bytes_per_second", "nodes", "world_size")
    } == {
        k: value[k]
        for k in ("busbw_bytes_per_second", "algbw_bytes_per_second", "nodes", "world_size")
    }
    assert math.isclose(run["algbw_bytes_per_second"], 262144 / value["time_s"])
    # What was printed is what was recorded.
    assert f"busbw  {run['busbw_bytes_per_second'] / 1e9:.3f} GB/s" in out
    assert f"algbw  {run['algbw_bytes_per_second'] / 1e9:.3f} GB/s" in out
    assert not [r for r in clients["bob"].telemetry()["allreduce"] if r["user"] == "alice"]


def test_nettest_across_nodes_refused_or_bad(shell, capsys):
    shell.run_line_magic("gpulab", "nettest --nodes 0")
    out = capsys.readouterr().out
    assert "--nodes must be >= 1" in out and "usage: %gpulab nettest" in out, out
    shell.run_line_magic("gpulab", "nettest --nodes 2 --gpu 1/3")
    assert "usage: %gpulab nettest" in capsys.readouterr().out
    shell.run_line_magic("gpulab", "nettest --gpu 1")  # --gpu without --nodes
    assert "--gpu, --pool and --backend go with --nodes" in capsys.readouterr().out
    # The service refuses what the cluster could never hold: a message, no traceback.
    shell.run_line_magic("gpulab", "nettest --nodes 2 --gpu 2")
    out = capsys.readouterr().out
    assert "nettest: the gpulab service refused the probe job:" in out, out
    assert "the cluster has 2 GPUs" in out and "Traceback" not in out, out
    shell.run_line_magic("gpulab", "nettest --nodes 2 --gpu 4")  # not a slice size: 400
    out = capsys.readouterr().out
    assert "is not a slice size offered here" in out and "usage: %gpulab nettest" in out, out


def test_nettest_job_failure_prints_its_message(shell, clients, capsys):
    # A job that runs for seconds (torch's import, 1000 all-reduces) and may run
    # 0.5 s: the service stops it, and the magic prints why, with no traceback.
    assert (
        shell.run_line_magic("gpulab", "nettest --nodes 2 --size 64K --iters 1000 --timeout 0.5")
        is None
    )
    out = capsys.readouterr().out
    m = re.search(r"^nettest: job (\w+) failed: timed out after 0.5 s", out, re.M)
    assert m and "Traceback" not in out and "recorded" not in out, out
    assert clients["alice"].get_job(m.group(1))["state"] == "failed"


def test_help_and_bad_arguments(shell, capsys):
    shell.run_line_magic("gpulab", "help")
    out = capsys.readouterr().out
    assert "%gpulab dashboard" in out and "%gpulab nettest" in out
    shell.run_line_magic("gpulab", "nettest --iters 0")
    assert "usage: %gpulab nettest" in capsys.readouterr().out
    shell.run_line_magic("gpulab", "nettest --sizes 1M")
    assert "unknown arguments --sizes 1M" in capsys.readouterr().out
    shell.run_line_magic("gpulab", "")
    assert "API:" in capsys.readouterr().out


async def test_dashboard_magic_shows_a_live_dashboard(
    service, names, monkeypatch, capsys, wait_for
):
    from ipywidgets.widgets.widget import _instances

    from gpulab.widgets import Dashboard

    # alice's kernel, on the service where her server holds 1/4 GPU.
    shell = magics_shell(monkeypatch, service.api, service.create_user(names["alice"]))
    before = {id(w) for w in _instances.values()}
    shell.run_line_magic("gpulab", "dashboard")
    boards = [
        w for w in list(_instances.values()) if isinstance(w, Dashboard) and id(w) not in before
    ]
    assert len(boards) == 1
    board = boards[0]
    try:
        await wait_for(lambda: board.model.answers >= 1, what="the magic's dashboard to update")
        assert board.error is None
        # alice's token, as served
        assert [s["user"] for s in board.model.slices] == [names["alice"]]
    finally:
        await asyncio.to_thread(board.close)  # it joins the updater, which asks the service
    shell.run_line_magic("gpulab", "dashboard now")
    assert "takes no arguments" in capsys.readouterr().out
