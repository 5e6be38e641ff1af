"""Ctrl-C on ``gpulab up``: it stops within seconds, user servers first (their slices
released through the still-running service), then the service; no traceback.

A terminal's Ctrl-C sends SIGINT to the foreground process group: the test does the
same to the group ``gpulab up`` leads (``RunningHub`` starts it in a session of its own).
"""

import os
import signal
import sqlite3
import subprocess
import time

import psutil
import pytest
from hubproc import RunningHub

pytestmark = pytest.mark.slow


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


def test_ctrl_c_stops_servers_then_the_service_quickly(tmp_path):
    hub = RunningHub(tmp_path / "hub", simulate="2xA100-80GB")
    try:
        hub.create_user("ctrlc")
        assert hub.spawn("ctrlc", {"gpu_milli": 250}).status_code in (201, 202)
        hub.wait_server("ctrlc")
        assert [a["milli"] for a in hub.gpulab("GET", "/allocations").json()] == [250]
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
        assert took < 30, f"Ctrl-C took {took:.1f} s:\n{said}"
        # The server went first, and its slice was given back while the service answered.
        gone, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive, f"server processes left after Ctrl-C: {alive}"
        assert held_in_ledger(hub.data_dir) == [], said
        assert "Could not release" not in said, said
    finally:
        hub.stop()
