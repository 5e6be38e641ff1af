"""Keeping the ledger true: the service's reconcile loop.

Every ``reconcile_interval`` seconds: release server allocations whose server is
gone (the hub says it is not running), then look for live owners that lost
their slice (:class:`~gpulab.service.operations.lost_slices.LostSlices`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

from gpulab.db.engine import utcnow
from gpulab.service.hubapi import HubAPI
from gpulab.service.operations.lost_slices import LostSlices
from gpulab.service.tasks import KeptTask

log = logging.getLogger("gpulab.service")


class Reconciler:
    """``hub`` says which servers run; ``ledger`` holds their slices; ``server_stopped``
    is told of each server found gone (what follows it stops too)."""

    def __init__(
        self,
        *,
        hub: HubAPI,
        ledger,
        lost_slices: LostSlices,
        server_stopped: Callable[[str], Awaitable[None]],
        interval: float,
    ):
        self.hub = hub
        self.ledger = ledger
        self.lost_slices = lost_slices
        self.server_stopped = server_stopped
        self.interval = interval
        self._loop = KeptTask("gpulab-reconcile", self.loop)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def reconcile_servers(self) -> None:
        """Release server allocations whose server is gone (hub says not active)."""
        started = utcnow()
        alive = await self.hub.active_servers()
        # Only allocations made before we asked: a spawn that allocated after
        # the hub answered is alive even though the answer does not list it.
        stale = [
            a
            for a in await self.ledger.aio.list(owner_kind="server")
            if a["owner"] not in alive and dt.datetime.fromisoformat(a["created"]) < started
        ]
        for owner in sorted({a["owner"] for a in stale}):
            released = await self.ledger.aio.release("server", owner)
            log.warning(
                "Released %d allocation(s) of server %s: it is not running", len(released), owner
            )
            await self.server_stopped(owner)

    async def loop(self) -> None:
        delay = 1.0
        while True:
            try:
                await self.reconcile_servers()
                await self.lost_slices.check()
                delay = self.interval
            except Exception as e:  # the hub may still be starting
                log.warning("Could not reconcile with the hub yet: %s", e)
                delay = min(max(delay * 2, 1.0), self.interval)
            await asyncio.sleep(delay)
