"""kill -9 of the hub, then `gpulab up` again on the same data dir: nothing of the first is left.

JupyterHub starts its services and the proxy in sessions of their own, so they
outlive a hub killed without its shutdown. The second `gpulab up` ends them (and
says so) before its own start; its service then gets its port and answers. A user's
server is the user's: it still runs, with its slice, and the new hub has it.
"""

import contextlib
import os
import signal

import psutil
import pytest
from hubproc import RunningHub, fresh_user

pytestmark = pytest.mark.slow


def platform_processes(hub) -> dict[str, psutil.Process]:
    """The hub's service, culler and proxy, by what they are."""
    found = {}
    for p in psutil.Process(hub.proc.pid).children(recursive=True):
        cmd = " ".join(p.cmdline())
        for what, mark in (
            ("service", "-m gpulab.service"),
            ("culler", "jupyterhub_idle_culler"),
            ("proxy", "configurable-http-proxy"),
        ):
            if mark in cmd:
                found[what] = p
    return found


def server_process(hub, user: str) -> psutil.Process:
    home = str(hub.home(user))
    for p in psutil.process_iter(["cmdline", "environ"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            cmd = " ".join(p.info["cmdline"] or [])
            if (p.info["environ"] or {}).get("HOME") == home and "jupyterhub-singleuser" in cmd:
                return p
    raise LookupError(f"no server process for {user}")


def hubs_on(data) -> list[psutil.Process]:
    """Every hub process on the data dir (a second one that failed to start included)."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            env = p.info["environ"] or {}
            if env.get("GPULAB_DATA_DIR") == str(data) and "gpulab.hub_ext.hub_app" in (
                p.info["cmdline"] or []
            ):
                found.append(p)
    return found


def still_running(p: psutil.Process) -> bool:
    """The very process (same pid and start time), not a zombie."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_second_up_ends_what_the_killed_hub_left(tmp_path):
    data = tmp_path / "hub"
    first = RunningHub(data)
    second = None
    left = {}
    try:
        user = fresh_user("survivor")
        first.create_user(user)
        assert first.spawn(user, {"gpu_milli": 250}).status_code in (201, 202)
        first.wait_server(user)
        server = server_process(first, user)
        left = platform_processes(first)
        assert set(left) == {"service", "culler", "proxy"}, left

        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        # What the hub started lives on without it (the reason for this test).
        assert all(still_running(p) for p in left.values())

        log_from = first.log_path.stat().st_size
        second = RunningHub(data)
        said = first.log_path.read_bytes()[log_from:].decode(errors="replace")

        alive = {what: p.pid for what, p in left.items() if still_running(p)}
        assert alive == {}, f"left running after the second `gpulab up`: {alive}\n{said}"
        assert (
            f"Ended the gpulab service (pid {left['service'].pid}) left by an earlier "
            f"`gpulab up` on {data}" in said
        ), said
        # The service that answers is the second hub's own, and it never fought for its port.
        new = second.service_pid()
        assert new and new != left["service"].pid
        assert second.gpulab("GET", "/allocations").status_code == 200
        assert "Address already in use" not in said, said
        # The user's server is not the platform's to end: it runs on, with its slice,
        # and the new hub has it.
        assert still_running(server), "the user's server was ended with the platform"
        assert second.hub_api("GET", f"/users/{user}").json()["servers"][""]["ready"]
        held = second.gpulab("GET", "/allocations").json()
        assert [(a["owner"], a["milli"]) for a in held] == [(f"{user}/", 250)]
    finally:
        if second is not None:
            second.stop()
        else:
            first.stop()  # it also ends the user's server
        for p in left.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        for p in hubs_on(data):  # a second hub that never answered
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        first._log.close()
