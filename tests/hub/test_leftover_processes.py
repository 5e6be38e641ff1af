"""`gpulab up` ends what an earlier hub on its data dir left, and nothing else.

Real processes stand in for the left ones: a Python that sleeps, with the command
line and environment of the gpulab service, the culler or the proxy. Those of
another data dir, another account, or with another command line stay running.
"""

import os
import signal
import subprocess
import sys

import pytest

from gpulab.hub_ext.leftover_processes import (
    LEAVE_WORK_SIGNAL,
    end_after_shutdown,
    end_leftovers,
    find,
    kind_of,
)
from gpulab.service import app as service_app

#: Sleeps; with "deaf" it ignores SIGTERM and SIGUSR1 (what the service is asked to stop
#: with). Says "ready" once it is in place.
SLEEP = """
import signal, sys, time
if "deaf" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def look_alike(data_dir, *args, user=None, deaf=False):
    """A sleeping process whose command line ends with ``args`` (``-m gpulab.service``)."""
    argv = [sys.executable, "-c", SLEEP, *args] + (["deaf"] if deaf else [])
    env = {"PATH": os.environ["PATH"], "GPULAB_DATA_DIR": str(data_dir)}
    p = subprocess.Popen(
        argv, env=env, start_new_session=True, user=user, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline() == "ready\n"
    return p


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_command_lines_of_the_platform_and_of_users():
    assert kind_of(["/usr/bin/python3", "-m", "gpulab.service"]) == "the gpulab service"
    assert kind_of(["python", "-m", "jupyterhub_idle_culler", "--timeout=60"]) == "the idle culler"
    # MLflow behind the hub: left running, it would hold its port from the next hub's.
    assert kind_of(["python", "-m", "gpulab.service.experiments"]) == "the MLflow service"
    assert kind_of(["node", "/x/bin/configurable-http-proxy", "--ip"]) == "configurable-http-proxy"
    assert kind_of(["python", "-m", "gpulab.hub_ext.hub_app", "-f", "c.py"]) == "the hub"
    # Users' work: servers, replicas, ranks.
    assert kind_of(["/venv/bin/jupyterhub-singleuser"]) is None
    assert kind_of(["python", "-m", "gpulab.serving.server", "--port", "1"]) is None
    assert kind_of(["torchrun", "--nproc-per-node=2", "train.py", "gpulab.service"]) is None


def test_ends_the_left_service_culler_and_proxy_and_says_so(tmp_path, procs):
    data = tmp_path / "data"
    data.mkdir()
    service = look_alike(data, "-m", "gpulab.service")
    culler = look_alike(data, "-m", "jupyterhub_idle_culler")
    procs += [service, culler]
    (data / "jupyterhub-proxy.pid").write_text(str(os.getpid()))  # a stale, reused pid
    said = []
    ended = end_leftovers(data, shown_as=".gpulab", say=said.append)
    assert sorted(ended) == sorted([service.pid, culler.pid])
    # The service is told to leave its jobs and replicas running for the next one
    # (not SIGTERM, on which `gpulab up`'s service stops them); the rest get SIGTERM.
    assert service.wait(timeout=30) == -LEAVE_WORK_SIGNAL
    assert culler.wait(timeout=30) == -signal.SIGTERM
    assert (
        f"Ended the gpulab service (pid {service.pid}) left by an earlier `gpulab up` on .gpulab"
        in said
    )
    assert (
        f"Ended the idle culler (pid {culler.pid}) left by an earlier `gpulab up` on .gpulab"
        in said
    )
    # JupyterHub would signal whatever runs under that pid now: the file is gone.
    assert not (data / "jupyterhub-proxy.pid").exists()
    assert find(data) == []


def test_one_that_ignores_sigterm_gets_sigkill(tmp_path, procs):
    deaf = look_alike(tmp_path, "-m", "gpulab.service", deaf=True)
    procs.append(deaf)
    assert end_leftovers(tmp_path, shown_as="d", say=lambda line: None) == [deaf.pid]
    assert deaf.wait(timeout=30) == -9


def test_leaves_other_data_dirs_other_accounts_and_users_work_alone(tmp_path, procs):
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    keep = [
        look_alike(other, "-m", "gpulab.service"),  # another hub's service
        look_alike(mine, "-m", "gpulab.serving.server"),  # a replica
        look_alike(mine, "jupyterhub-singleuser"),  # a server
    ]
    if os.geteuid() == 0:  # an account's process dressed as the service
        keep.append(look_alike(mine, "-m", "gpulab.service", user="nobody"))
    procs += keep
    assert end_leftovers(mine, shown_as="mine", say=lambda line: None) == []
    assert all(p.poll() is None for p in keep)


def test_refuses_to_start_beside_a_running_hub(tmp_path, procs):
    hub = look_alike(tmp_path, "-m", "gpulab.hub_ext.hub_app")
    service = look_alike(tmp_path, "-m", "gpulab.service")
    procs += [hub, service]
    with pytest.raises(SystemExit, match=f"already running on d \\(pid {hub.pid}\\)"):
        end_leftovers(tmp_path, shown_as="d", say=lambda line: None)
    assert hub.poll() is None and service.poll() is None  # the running hub's own


def test_the_signal_that_leaves_work_running_is_the_one_the_service_handles():
    assert LEAVE_WORK_SIGNAL == service_app.LEAVE_WORK_SIGNAL


def test_what_still_runs_as_the_hub_stops_is_ended(tmp_path, procs):
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    # A standby router whose service was killed, and a service that would not stop.
    standby = look_alike(mine, "-m", "gpulab.service", "endpoint-standby")
    stuck = look_alike(mine, "-m", "gpulab.service", deaf=True)
    keep = look_alike(other, "-m", "gpulab.service", "endpoint-standby")
    procs += [standby, stuck, keep]
    said = []
    ended = end_after_shutdown(mine, say=said.append)
    assert sorted(ended) == sorted([standby.pid, stuck.pid])
    assert standby.wait(timeout=30) == -signal.SIGTERM
    assert stuck.wait(timeout=30) == -signal.SIGKILL
    assert keep.poll() is None
    assert (
        f"Ended the standby endpoint router (pid {standby.pid}), still running as the hub stopped"
        in said
    )
