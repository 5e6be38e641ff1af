"""This node's telemetry, sampled by the service itself where no node agent runs
(``c.TelemetrySettings.local_sampler``; off where `gpulab agent` runs on every node)."""

from __future__ import annotations

import asyncio
import logging
import os

from gpulab.service.tasks import KeptTask
from gpulab.service.telemetry.store import TelemetryStore
from gpulab.telemetry import NodeSampler

log = logging.getLogger("gpulab.service")


class LocalSampler:
    """Samples this node every ``c.TelemetrySettings.sample_interval`` seconds, off the event loop
    (c.TelemetrySettings.local_sampler; off where `gpulab agent` runs on every node)."""

    def __init__(self, *, telemetry: TelemetryStore, node: str, interval: float):
        self.telemetry = telemetry
        self.interval = interval
        self.sampler = NodeSampler(node=node, cache_dir=os.environ.get("GPULAB_CACHE_DIR") or None)
        self._loop = KeptTask("gpulab-local-sampler", self.loop)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def loop(self) -> None:
        while True:
            try:
                sample = await asyncio.to_thread(self.sampler.sample)
                sample["allreduce"] = []
                self.telemetry.add(sample)
            except Exception:
                log.exception("local telemetry sample failed")
            await asyncio.sleep(self.interval)
