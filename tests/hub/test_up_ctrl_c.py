"""Ctrl-C on ``gpulab up`` with a user's server, a running job and a serving endpoint:
it stops within seconds and leaves nothing running. The server goes first (its slice
released through the still-running service); the job saves a checkpoint and waits in
the queue, the endpoint's replicas stop; the next ``gpulab up`` on the same data dir
resumes the job from its checkpoint and serves the endpoint again. No traceback.

A terminal's Ctrl-C sends SIGINT to the foreground process group: the test does the
same to the group ``gpulab up`` leads (``RunningHub`` starts it in a session of its own).
"""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
import torch
from hubproc import RunningHub
from support.wait import wait_until

from gpulab.client import Client
from gpulab.hub_ext import leftover_processes
from gpulab.serving.export import export_model

sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
from cells import LINEAR  # noqa: E402
from jobhelpers import submit, wait_job, wait_metrics  # noqa: E402

pytestmark = pytest.mark.slow
BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def server_processes(hub) -> list[psutil.Process]:
    """Processes started for the hub's users (their HOME is under the data dir)."""
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("HOME", "").startswith(str(hub.data_dir / "home")):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def held_in_ledger(data_dir) -> list[tuple]:
    """Allocations still in the service's SQLite ledger (what a restart would find)."""
    with sqlite3.connect(data_dir / "gpulab.sqlite") as db:
        return db.execute("SELECT owner_kind, owner, milli FROM gpulab_allocations").fetchall()


def job_row(data_dir, job_id) -> tuple[str, str]:
    with sqlite3.connect(data_dir / "gpulab.sqlite") as db:
        return db.execute(
            "SELECT state, message FROM gpulab_jobs WHERE id = ?", (job_id,)
        ).fetchone()


def model_dir(tmp_path) -> str:
    torch.manual_seed(0)
    path = tmp_path / "model"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    export_model(model, torch.randn(2, 4), str(path), name="ignored", max_batch_size=8)
    return str(path)


def ready_replicas(hub, token) -> int:
    return hub.gpulab("GET", "/deployments/ctrlc", token=token).json().get("replicas_ready", 0)


def test_ctrl_c_stops_everything_quickly_and_the_next_up_resumes_it(tmp_path):
    hub = RunningHub(tmp_path / "hub", simulate="2xA100-80GB")
    try:
        token = hub.create_user("ctrlc")
        hub.spawn_ready({"ctrlc": {"gpu_milli": 250}})
        # A job slow enough to be mid-run at the Ctrl-C, and an endpoint.
        env = {"STEPS": "60", "STEP_DELAY": "0.2", "FAST_ONCE_RESUMED": "1"}
        job = submit(hub, token, LINEAR, gpu_milli=250, env=env).json()
        Client(hub.api, token=token).create_deployment(
            model_dir(tmp_path), {"name": "ctrlc", "gpu_milli": 100}
        )
        wait_metrics(hub, token, job["id"], 5)
        wait_until(lambda: ready_replicas(hub, token) == 1, "the endpoint's replica ready")
        servers = server_processes(hub)
        assert servers, "the user's server process was not found"
        log_before = hub.log_path.stat().st_size

        started = time.monotonic()
        os.killpg(hub.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        try:
            code = hub.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gpulab up still running 120 s after Ctrl-C:\n{hub.log_tail()}")
        took = time.monotonic() - started
        print(f"gpulab up exited {took:.1f} s after Ctrl-C (exit status {code})")

        said = hub.log_path.read_bytes()[log_before:].decode(errors="replace")
        assert "Traceback" not in said, said
        # Loose on purpose (a busy machine): what it catches is a timeout waited out.
        assert took < 20, f"Ctrl-C took {took:.1f} s:\n{said}"
        # Nothing is left: not the server, the ranks or the replica (their HOME is
        # under the data dir), nor the service, the standby router, the culler or the proxy.
        gone, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive, f"server processes left after Ctrl-C: {alive}"
        assert server_processes(hub) == [], said
        left = leftover_processes.find(hub.data_dir)
        assert [p.what for p in left] == [], said
        # The server's slice was given back while the service answered; the job's went
        # with it to the queue; the endpoint keeps its slice for the next start.
        assert [(kind, milli) for kind, _, milli in held_in_ledger(hub.data_dir)] == [
            ("deployment", 100)
        ], said
        assert "Could not release" not in said, said
        state, message = job_row(hub.data_dir, job["id"])
        assert state == "queued" and "resumes from its checkpoint at step" in message, message
        hub._log.close()

        hub = RunningHub(hub.data_dir, simulate="2xA100-80GB")
        token = hub.create_user("ctrlc")
        done = wait_job(hub, token, job["id"])
        assert done["state"] == "succeeded", done
        records = hub.gpulab("GET", f"/jobs/{job['id']}/metrics", token=token).json()["records"]
        assert [r["step"] for r in records][-1] == 59
        wait_until(lambda: ready_replicas(hub, token) == 1, "the endpoint serving again")
        url = f"{hub.url}/services/gpulab/endpoints/ctrlc/ctrlc/v2/models/ctrlc/infer"
        r = requests.post(url, json=BODY, headers=hub.auth(token), timeout=60)
        assert r.status_code == 200, r.text
    finally:
        hub.stop()
