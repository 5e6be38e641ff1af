"""The hub's shutdown after the servers: the services together, then whatever is left.

JupyterHub stops its managed services one after the other and looks whether each
has exited at waits that double from 0.1 s, so a service that exits at once is
noticed a second or more later. Here every managed service (the gpulab service, the
idle culler) is asked at the same time, and its exit is noticed when it happens.
Then whatever of the platform still runs on the data dir (a standby router whose
service was killed, a service that did not stop) is ended
(:func:`.leftover_processes.end_after_shutdown`): nothing outlives ``gpulab up``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

from . import leftover_processes

#: How long a service has to stop on SIGTERM before JupyterHub's own stop goes on
#: (its SIGTERM again, then SIGKILL).
SERVICE_STOP_S = 10.0


async def stop_services(hub) -> None:
    """Stop every managed service of ``hub`` together."""
    managed = [s for s in hub._service_map.values() if s.managed and s.spawner is not None]
    results = await asyncio.gather(*(_stop(s) for s in managed), return_exceptions=True)
    for service, result in zip(managed, results, strict=True):
        if isinstance(result, BaseException):
            hub.log.error("Failed to stop the service %s: %s", service.name, result)


async def _stop(service) -> None:
    """SIGTERM, and the moment it exits JupyterHub's stop (its records) finds it gone;
    one still running after SERVICE_STOP_S gets JupyterHub's stop at once. SIGTERM, not
    JupyterHub's SIGINT: the gpulab service stops the same on either, and a culler still
    importing when Ctrl-C comes would print a KeyboardInterrupt traceback on SIGINT."""
    proc = service.spawner.proc
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, SERVICE_STOP_S)
    service.spawner.interrupt_timeout = 0  # it had its signal: on to SIGTERM
    await service.stop()


async def end_what_is_left(hub) -> None:
    """End the platform's processes on the data dir that still run (each is logged)."""
    data_dir = os.environ.get("GPULAB_DATA_DIR")
    if data_dir:
        await asyncio.to_thread(
            leftover_processes.end_after_shutdown, Path(data_dir), hub.log.warning
        )


def end_after_interrupted_start() -> None:
    """Ctrl-C while the hub starts (before its shutdown is in place): end what it had
    started. A service may fork its standby router meanwhile: looked for again."""
    data_dir = os.environ.get("GPULAB_DATA_DIR")
    for _ in range(3):
        if not data_dir or not leftover_processes.end_after_shutdown(Path(data_dir), print):
            return
