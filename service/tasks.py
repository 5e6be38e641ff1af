"""A background loop the service keeps, so that stopping the service can end it.

``asyncio.ensure_future`` without keeping the task loses it: nothing can cancel
it on shutdown and the event loop may even collect it mid-run. Every loop of
the service (reconcile, job queue, local sampler) is one :class:`KeptTask`; a
one-off step a loop hands off (a scale step, a rollback, a claim's launch) goes in
a :class:`TaskSet`, which stopping cancels.
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
        # Until it ends: on Python 3.11 ``asyncio.wait_for`` swallows a cancel that
        # arrives as its inner wait completes, and the loop would go on forever.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1)
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def every(seconds: float, step: Callable[[], Awaitable], what: str, log) -> None:
    """Run ``step`` every ``seconds``, for ever (a :class:`KeptTask`'s body): a round
    that fails (the hub restarting, say) is logged as ``what`` and the next one runs."""
    while True:
        try:
            await step()
        except Exception:
            log.exception(what)
        await asyncio.sleep(seconds)


class TaskSet:
    """One-off tasks kept until they end, so that stopping can cancel those still running."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_wake(wake: asyncio.Event, timeout: float) -> None:
    """Until ``wake`` is set or ``timeout`` seconds pass; a cancel always propagates
    (``asyncio.wait_for`` may swallow one on Python 3.11)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await wake.wait()


async def run_unless(stop: asyncio.Event, coro: Awaitable[None]) -> None:
    """Run ``coro`` to its end, unless ``stop`` is set first: then it is cancelled (and
    waited for) and this returns. An error of ``coro`` raises here."""
    task = asyncio.ensure_future(coro)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return
    task.result()
