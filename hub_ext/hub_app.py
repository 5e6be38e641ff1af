"""The JupyterHub that ``gpulab up`` runs: JupyterHub, stopping in the order gpulab needs.

JupyterHub's own shutdown (``JupyterHub.cleanup``, on SIGINT or SIGTERM) stops the
managed services first and the single-user servers after them. A server's spawner
gives its slice back through the gpulab service as the server stops; with the
service already gone it retried for seconds and gave up, and the slice stayed in the
ledger until the service next reconciled. Here the servers stop first, all at once,
while the service still answers; then JupyterHub stops the services and the proxy.

A second Ctrl-C while it stops is noted, not acted on: a shutdown started twice
tears the event loop down under the first one.
"""

from __future__ import annotations

import asyncio
import sys

from jupyterhub.app import JupyterHub


class GpuLabHub(JupyterHub):
    """JupyterHub whose shutdown stops user servers before the services."""

    _stopping = False

    async def shutdown_cancel_tasks(self, sig=None):
        if self._stopping:
            self.log.warning("Already stopping: servers first, then the gpulab service")
            return
        self._stopping = True
        await super().shutdown_cancel_tasks(sig)

    async def cleanup(self):
        if self.cleanup_servers:
            await self.stop_servers()
        await super().cleanup()  # services and the proxy; no server is left to stop

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
        self.log.info(
            "Stopping %i single-user server(s) before the gpulab service: %s",
            len(stops),
            ", ".join(names),
        )
        for name, result in zip(
            names, await asyncio.gather(*stops, return_exceptions=True), strict=True
        ):
            if isinstance(result, BaseException):
                self.log.error("Failed to stop the server %s: %s", name, result)


def main(argv: list[str] | None = None) -> int:
    """``jupyterhub`` with :class:`GpuLabHub` (``argv``: JupyterHub's arguments).

    Ctrl-C before the hub has its signal handlers (while it starts) ends it with a
    line, not a KeyboardInterrupt traceback.
    """
    try:
        GpuLabHub.launch_instance(argv)
    except KeyboardInterrupt:
        print("\ngpulab up: interrupted while starting", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
