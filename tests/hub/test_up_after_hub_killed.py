"""kill -9 of the hub, then `gpulab up` again on the same data dir: nothing of the first is left.

JupyterHub starts its services and the proxy in sessions of their own, so they
outlive a hub killed without its shutdown. The second `gpulab up` ends them (and
says so) before its own start; its service then gets its port and answers. A user's
server is the user's: it still runs, with its slice, and the new hub has it. So do
the user's job and endpoint: the old service is ended without stopping them (on its
Ctrl-C `gpulab up`'s service stops its work), and the new one adopts them, as after
a crash of the service alone: the same rank and replica processes, nothing begins again.
Then a clean SIGTERM of the second hub ends everything and leaves nothing behind.
"""

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from hub_work import deploy, infer, rank_pids, server_processes
from hubproc import RunningHub, fresh_user, replica_pids
from support.leftovers import cgroups_of, job_namespaces, platform_processes
from support.wait import wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
from cells import LINEAR  # noqa: E402
from jobhelpers import pid_alive, submit, wait_job, wait_metrics  # noqa: E402

pytestmark = pytest.mark.slow


def platform_processes_of(hub) -> dict[str, psutil.Process]:
    """The hub's service, MLflow service, culler and proxy, by what they are."""
    found = {}
    for p in psutil.Process(hub.proc.pid).children(recursive=True):
        argv = p.cmdline()
        cmd = " ".join(argv)
        for what, mark in (
            ("service", ["-m", "gpulab.service"]),
            ("mlflow", ["-m", "gpulab.service.experiments"]),
            ("culler", "jupyterhub_idle_culler"),
            ("proxy", "configurable-http-proxy"),
        ):
            # A module is named exactly (gpulab.service is not gpulab.service.experiments).
            named = (
                any(argv[i : i + 2] == mark for i in range(len(argv)))
                if isinstance(mark, list)
                else mark in cmd
            )
            if named:
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


def test_second_up_ends_what_the_killed_hub_left_and_adopts_the_work(tmp_path):
    data = tmp_path / "hub"
    first = RunningHub(data)
    second = None
    left = {}
    try:
        user = fresh_user("survivor")
        token = first.create_user(user)
        groups = set(cgroups_of(user))  # an earlier run's on this host are not ours
        assert first.spawn(user, {"gpu_milli": 250}).status_code in (201, 202)
        first.wait_server(user)
        server = server_process(first, user)
        # A job held at step 5 until the test opens its gate, and an endpoint.
        gate = data / "go"
        env = {"STEPS": "30", "GATE": str(gate)}
        job = submit(first, token, LINEAR, gpu_milli=250, env=env).json()
        wait_metrics(first, token, job["id"], 5)
        deploy(first, token, tmp_path, "kept")
        dep_id = first.gpulab("GET", "/deployments/kept", token=token).json()["id"]
        ranks, replicas = rank_pids(first, job["id"]), replica_pids(first, dep_id)
        assert ranks and replicas
        left = platform_processes_of(first)
        # The MLflow service runs where its extra is installed (make up installs it).
        assert set(left) - {"mlflow"} == {"service", "culler", "proxy"}, left

        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        # What the hub started lives on without it (the reason for this test), but for
        # the idle culler, whose token (it stops anyone's server) would go to whoever
        # takes the hub's port: it ends with the hub.
        culler = left.pop("culler")
        wait_until(lambda: not still_running(culler), "the culler to end with the hub", 30)
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
        assert sorted((a["owner_kind"], a["milli"]) for a in held) == [
            ("deployment", 100),
            ("job", 250),
            ("server", 250),
        ], held
        assert "Leaving jobs and endpoints running for the next gpulab service" in said, said
        # The job and the endpoint were adopted, not stopped and started again: the same
        # processes, no preemption, and the job goes on from step 5, not from step 0.
        assert all(pid_alive(p) for p in ranks), said
        assert replica_pids(second, dep_id) == replicas, said
        seen = second.gpulab("GET", f"/jobs/{job['id']}", token=token).json()
        assert (seen["state"], seen["preemptions"]) == ("running", 0), seen
        assert infer(second, token, user, "kept").status_code == 200
        gate.touch()
        done = wait_job(second, token, job["id"])
        assert (done["state"], done["preemptions"]) == ("succeeded", 0), done
        records = second.gpulab("GET", f"/jobs/{job['id']}/metrics", token=token).json()
        assert [r["step"] for r in records["records"]] == list(range(30))

        # A clean SIGTERM of the hub alone (a service manager's stop) ends everything:
        # the server, the replica, the service and its standby router, the proxy.
        users_work = server_processes(second)
        log_from = second.log_path.stat().st_size
        started = time.monotonic()
        second.proc.send_signal(signal.SIGTERM)
        code = second.proc.wait(timeout=120)
        print(f"gpulab up exited {time.monotonic() - started:.1f} s after SIGTERM ({code})")
        said = second.log_path.read_bytes()[log_from:].decode(errors="replace")
        assert "Traceback" not in said, said
        gone, alive = psutil.wait_procs(users_work, timeout=10)
        assert not alive, f"users' processes left after SIGTERM: {alive}\n{said}"
        assert platform_processes(data) == [], said
        assert job_namespaces([job["id"]]) == [], said
        assert set(cgroups_of(user)) <= groups, said
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
