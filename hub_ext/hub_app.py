"""The JupyterHub that ``gpulab up`` runs: JupyterHub, stopping in the order gpulab needs.

JupyterHub's own shutdown (``JupyterHub.cleanup``, on SIGINT or SIGTERM) stops the
managed services first and the single-user servers after them. A server's spawner
gives its slice back through the gpulab service as the server stops; with the
service already gone it retried for seconds and gave up, and the slice stayed in the
ledger until the service next reconciled. Here the servers stop first, all at once,
while the service still answers; then the services, together (:mod:`.hub_shutdown`),
and the proxy; last, whatever of the platform still runs on the data dir is ended.

The servers are stopped, not hibernated: their kernels' variables are lost, and the
log says so (a hub that stops cannot wait minutes for every kernel to save).

A second Ctrl-C while it stops is noted, not acted on: a shutdown started twice
tears the event loop down under the first one.

A managed service that dies is noticed when JupyterHub next polls it, up to 30 s
(``Spawner.poll_interval``) later; until the hub starts it again every endpoint call
gets a 503 (the endpoint router runs in the service). Here the hub looks every
second at services that had run a while (``c.GpuLabHub.quick_restart_after_seconds``),
so a crash of the gpulab service costs a few seconds; one that dies soon after its
start keeps JupyterHub's 30 s pace rather than a restart every second.
"""

from __future__ import annotations

import asyncio
import math
import signal
import sys
import time

from jupyterhub.app import JupyterHub
from tornado.ioloop import PeriodicCallback
from traitlets import Float

from . import hub_shutdown

#: How often the hub looks whether a managed service still runs.
SERVICE_POLL_S = 1.0
#: A service that ran at least this long is restarted at once when it dies (the default).
QUICK_RESTART_AFTER_S = 30.0


class GpuLabHub(JupyterHub):
    """JupyterHub whose shutdown stops user servers before the services."""

    quick_restart_after_seconds = Float(
        QUICK_RESTART_AFTER_S,
        config=True,
        help="""A managed service (the gpulab service) that dies after running at least
        this many seconds is restarted within a second; one that dies sooner after its
        start waits for JupyterHub's own poll (every 30 s), so a service that cannot
        start is not restarted every second. Tests that kill a young service set it
        lower.

        c.GpuLabHub.quick_restart_after_seconds = 30
        """,
    )

    _stopping = False

    async def start_service(self, service_name, service, ssl_context=None):
        # Under internal_ssl JupyterHub 6.1 checks a managed service's URL with the
        # context its own https server listens with (Purpose.CLIENT_AUTH: a server-side
        # context), so every check fails ("Cannot create a client socket with a
        # PROTOCOL_TLS_SERVER context") and the hub exits. Without one given it builds
        # the client-side context itself (Purpose.SERVER_AUTH).
        return await super().start_service(service_name, service, None)

    async def start(self):
        await super().start()
        self._service_started: dict[int, float] = {}
        watch = PeriodicCallback(self.poll_services, 1e3 * SERVICE_POLL_S)
        self._periodic_callbacks["gpulab_poll_services"] = watch
        watch.start()

    async def poll_services(self) -> None:
        """Let JupyterHub notice now (and restart) a service that died after running a
        while; the notice is JupyterHub's own (``poll_and_notify``), only sooner."""
        if self._stopping:
            return
        now = time.monotonic()
        running = set()
        for service in list(self._service_map.values()):
            proc = service.spawner.proc if service.managed and service.spawner else None
            if proc is None:
                continue
            running.add(proc.pid)
            started = self._service_started.setdefault(proc.pid, now)
            if now - started >= self.quick_restart_after_seconds and proc.poll() is not None:
                self._service_started[proc.pid] = math.inf  # noticed: once is enough
                await service.spawner.poll_and_notify()
        for pid in set(self._service_started) - running:
            del self._service_started[pid]

    async def shutdown_cancel_tasks(self, sig=None):
        if self._stopping:
            self.log.warning("Already stopping: servers first, then the gpulab service")
            return
        self._stopping = True
        await super().shutdown_cancel_tasks(sig)

    async def cleanup(self):
        self._stopping = True  # no restart of the services JupyterHub now stops
        # JupyterHub's periodic checks would look at parts being stopped (its services'
        # health check failed on a stopped service's server: an AttributeError).
        for callback in self._periodic_callbacks.values():
            callback.stop()
        if self.cleanup_servers:
            await self.stop_servers()
        await hub_shutdown.stop_services(self)  # together, noticed at once
        await super().cleanup()  # the proxy; no server or service is left to stop
        await hub_shutdown.end_what_is_left(self)

    async def stop_servers(self) -> None:
        """Stop every active server together; their spawners release the slices."""
        stops, names = [], []
        for _, user in self.users.items():
            for name, spawner in list(user.spawners.items()):
                if spawner.active:
                    stops.append(user.stop(name))
                    names.append(f"{user.name}/{name}")
        if not stops:
            return
        self.log.warning(stopping_servers_line(names))
        for name, result in zip(
            names, await asyncio.gather(*stops, return_exceptions=True), strict=True
        ):
            if isinstance(result, BaseException):
                self.log.error("Failed to stop the server %s: %s", name, result)


def stopping_servers_line(names: list[str]) -> str:
    """The log's line as the hub stops running servers. They are stopped, not
    hibernated (a hub stopping has no minutes to wait for every kernel to save), so
    the line says their variables are lost and how to keep them next time."""
    servers = "1 single-user server" if len(names) == 1 else f"{len(names)} single-user servers"
    return (
        f"Stopping {servers} without hibernating them (their kernels' variables are not "
        f"saved; `%gpulab hibernate` in each before stopping the hub keeps them): "
        f"{', '.join(names)}"
    )


def main(argv: list[str] | None = None) -> int:
    """``jupyterhub`` with :class:`GpuLabHub` (``argv``: JupyterHub's arguments).

    Ctrl-C before the hub has its signal handlers (while it starts) ends it with a
    line, not a KeyboardInterrupt traceback, and ends what it had started.
    """
    # SIGTERM before then is taken as Ctrl-C (its default would end the hub at once).
    signal.signal(signal.SIGTERM, _interrupt)
    # And Ctrl-C is Ctrl-C, as it is once JupyterHub's handler is in place, whatever
    # this process inherited: one started by a parent that ignores SIGINT (a shell
    # script's background job, a test runner's worker) would otherwise ignore it
    # until then, and a Ctrl-C while it starts would leave it running.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        GpuLabHub.launch_instance(argv)
    except KeyboardInterrupt:
        print("\ngpulab up: interrupted while starting", flush=True)
        # What it had started by then (the service, the culler, the proxy) goes too.
        hub_shutdown.end_after_interrupted_start()
        return 130
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
