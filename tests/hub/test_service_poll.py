"""The hub notices at its next second's look that a managed service died, not up to
30 s later (JupyterHub's own poll): endpoint calls get 503s only while the service is
really down. A service that dies young keeps JupyterHub's pace (no restart storm).

Real processes stand for the service; its spawner is a stand-in that records the
notice JupyterHub's ``poll_and_notify`` would act on (restart the service).
"""

import asyncio
import subprocess
import sys

import pytest
from jupyterhub.services.service import Service

from gpulab.hub_ext.hub_app import GpuLabHub


class Spawner:
    def __init__(self, proc):
        self.proc = proc
        self.notified = 0

    async def poll_and_notify(self):
        self.notified += 1


def service_running(name="gpulab"):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    service = Service(name=name, command=["python", "-m", "gpulab.service"])
    service.spawner = Spawner(proc)
    return service


@pytest.fixture
def hub():
    h = GpuLabHub()
    h._service_started = {}
    yield h
    for service in h._service_map.values():
        service.spawner.proc.kill()
        service.spawner.proc.wait()


def poll(hub):
    asyncio.run(hub.poll_services())


def test_a_service_that_ran_a_while_and_died_is_noticed_at_once(hub):
    service = hub._service_map["gpulab"] = service_running()
    poll(hub)  # seen running
    hub.quick_restart_after_seconds = 0.0
    poll(hub)
    assert service.spawner.notified == 0  # still running: nothing to say
    service.spawner.proc.kill()
    service.spawner.proc.wait()
    poll(hub)
    assert service.spawner.notified == 1
    poll(hub)  # the same dead process is not reported twice
    assert service.spawner.notified == 1


def test_a_young_service_or_a_stopping_hub_is_left_to_jupyterhub(hub):
    young = hub._service_map["gpulab"] = service_running()
    young.spawner.proc.kill()
    young.spawner.proc.wait()
    poll(hub)
    assert young.spawner.notified == 0  # dies soon after its start: JupyterHub's 30 s

    hub._service_started = {young.spawner.proc.pid: -1e9}  # ran long ago
    hub._stopping = True  # JupyterHub is stopping its services: no restart
    poll(hub)
    assert young.spawner.notified == 0
