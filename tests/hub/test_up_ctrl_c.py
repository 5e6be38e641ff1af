"""Ctrl-C on ``gpulab up`` with a user's server, a running job and a serving endpoint:
it stops within seconds and leaves nothing running. The server goes first (its slice
released through the still-running service); the job saves a checkpoint and waits in
the queue, the endpoint's replicas stop; the next ``gpulab up`` on the same data dir
resumes the job from its checkpoint and serves the endpoint again. No traceback.
Nothing is left on the host either: no process of the platform or of its users, no
job's network namespace, no cgroup of the user's. Ctrl-C on an idle hub too.

A terminal's Ctrl-C sends SIGINT to the foreground process group: the test does the
same to the group ``gpulab up`` leads (``RunningHub`` starts it in a session of its own).
How long each took is printed (``-s``), not asserted.
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
from hub_work import deploy, infer, ready_replicas, server_processes
from hubproc import GPULAB, RunningHub, server_process
from support.leftovers import cgroups_of, job_namespaces, platform_processes
from support.wait import wait_until

from gpulab.hub_ext import leftover_processes
from gpulab.hub_ext.ports import free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
from cells import LINEAR  # noqa: E402
from jobhelpers import submit, wait_job, wait_metrics  # noqa: E402

pytestmark = pytest.mark.slow


def held_in_ledger(data_dir) -> list[tuple]:
    """Allocations still in the service's SQLite ledger (what a restart would find)."""
    with sqlite3.connect(data_dir / "gpulab.sqlite") as db:
        return db.execute("SELECT owner_kind, owner, milli FROM gpulab_allocations").fetchall()


def job_row(data_dir, job_id) -> tuple[str, str]:
    with sqlite3.connect(data_dir / "gpulab.sqlite") as db:
        return db.execute(
            "SELECT state, message FROM gpulab_jobs WHERE id = ?", (job_id,)
        ).fetchone()


def ctrl_c(hub, what: str) -> str:
    """Ctrl-C on ``gpulab up``; what it logged meanwhile. Prints how long it took."""
    log_before = hub.log_path.stat().st_size
    started = time.monotonic()
    os.killpg(hub.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    try:
        code = hub.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpulab up still running 120 s after Ctrl-C:\n{hub.log_tail()}")
    took = time.monotonic() - started
    print(f"gpulab up ({what}) exited {took:.1f} s after Ctrl-C (exit status {code})")
    said = hub.log_path.read_bytes()[log_before:].decode(errors="replace")
    assert "Traceback" not in said and "AttributeError" not in said, said
    return said


def test_ctrl_c_on_an_idle_hub_leaves_nothing(tmp_path):
    # JupyterHub's check of its services, every second: it must not look at a service
    # being stopped (it failed on one with an AttributeError while the hub stopped).
    hub = RunningHub(tmp_path / "hub", config="c.JupyterHub.service_check_interval = 1\n")
    try:
        said = ctrl_c(hub, "idle")  # no server, job or endpoint
        assert platform_processes(hub.data_dir) == [], said
    finally:
        hub.stop()


def test_ctrl_c_while_it_starts_leaves_nothing(tmp_path):
    """Before the hub's shutdown is in place: it has started the proxy and its service
    and waits for the service to answer; they are ended with it. Started as a parent
    that ignores SIGINT starts it (a shell script's background job; in one CI run a
    test worker), whose children inherit the ignoring."""
    data = tmp_path / "hub"
    argv = [GPULAB, "up", "--port", str(free_port()), "--data-dir", str(data)]
    argv += ["--simulate-gpus", "2xA100-80GB"]
    output = tmp_path / "up.log"  # a file: what it left would hold a pipe open
    with open(output, "wb") as out:
        up = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        wait_until(
            lambda: any(
                "gpulab.service" in " ".join(p.cmdline())
                for p in psutil.Process(up.pid).children(recursive=True)
            ),
            "gpulab up to start its service",
            timeout=120,
        )
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=120)
        said = output.read_text(errors="replace")
        assert up.returncode == 130 and "interrupted while starting" in said, said
        assert platform_processes(data) == [], said
    finally:
        if up.poll() is None:
            up.kill()
        for p in leftover_processes.find(data):
            os.kill(p.pid, signal.SIGKILL)
            p.close()


def test_ctrl_c_stops_everything_quickly_and_the_next_up_resumes_it(tmp_path):
    # In a terminal, as `gpulab up` typed in a shell: users' servers must not hold it
    # (they could read what the operator types there).
    hub = RunningHub(tmp_path / "hub", simulate="2xA100-80GB", terminal=True)
    try:
        token = hub.create_user("ctrlc")
        groups = set(cgroups_of("ctrlc"))  # an earlier run's on this host are not ours
        hub.spawn_ready({"ctrlc": {"gpu_milli": 250}})
        # A job slow enough to be mid-run at the Ctrl-C, and an endpoint.
        env = {"STEPS": "60", "STEP_DELAY": "0.2", "FAST_ONCE_RESUMED": "1"}
        job = submit(hub, token, LINEAR, gpu_milli=250, env=env).json()
        deploy(hub, token, tmp_path, "ctrlc")
        wait_metrics(hub, token, job["id"], 5)
        servers = server_processes(hub)
        assert servers, "the user's server process was not found"
        lab = server_process("HOME", str(hub.home("ctrlc")))
        assert os.readlink(f"/proc/{lab.pid}/fd/0") == "/dev/null"

        said = ctrl_c(hub, "a server, a job and an endpoint")
        # Nothing is left: not the server, the ranks or the replica (their HOME is
        # under the data dir), nor the service, the standby router, the culler or the
        # proxy; nor the job's network namespace or a cgroup of the user's.
        gone, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive, f"server processes left after Ctrl-C: {alive}"
        assert server_processes(hub) == [], said
        assert platform_processes(hub.data_dir) == [], said
        assert job_namespaces([job["id"]]) == [], said
        assert set(cgroups_of("ctrlc")) <= groups, said
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
        wait_until(lambda: ready_replicas(hub, token, "ctrlc") == 1, "the endpoint serving again")
        r = infer(hub, token, "ctrlc", "ctrlc")
        assert r.status_code == 200, r.text
    finally:
        hub.stop()
