"""A background loop the service keeps, so that stopping the service can end it.

``asyncio.ensure_future`` without keeping the task loses it: nothing can cancel
it on shutdown and the event loop may even collect it mid-run. Every loop of
the service (reconcile, job queue, local sampler) is one :class:`KeptTask`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class KeptTask:
    def __init__(self, name: str, run: Callable[[], Awaitable[None]]):
        self.name = name
        self._run = run
        self.task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        if not self.running:
            self.task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
