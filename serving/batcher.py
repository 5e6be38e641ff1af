"""Dynamic batching: gather concurrent requests into one model call.

Requests wait in a bounded queue. A single worker takes the oldest request, then
keeps taking more until the batch holds ``max_batch_size`` rows or the oldest
request has waited ``max_queue_delay_ms``; it runs the batch in a thread (the
event loop keeps answering) and hands each request its own rows back. While a
batch runs, the next one fills up, so under load batches form without waiting.

When the queue holds ``max_queue`` requests, :meth:`DynamicBatcher.submit`
raises :class:`QueueFull` at once (the server answers 429) instead of letting
latency grow without bound. :meth:`DynamicBatcher.stop` refuses new requests
(:class:`Closed`) and answers the queued ones before it returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# Runs one batch: one array per input (rows concatenated), returns one per output.
RunBatch = Callable[[list[np.ndarray]], Sequence[np.ndarray]]


class QueueFull(Exception):
    """The batcher's queue is full; retry later."""


class Closed(Exception):
    """The batcher is shutting down and takes no more requests."""


@dataclass
class _Pending:
    inputs: list[np.ndarray]
    rows: int
    enqueued: float
    future: asyncio.Future = field(repr=False)


class DynamicBatcher:
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch_size: int = 32,
        max_queue_delay_ms: float = 5.0,
        max_queue: int = 256,
        on_batch: Callable[[int], None] | None = None,
    ):
        if max_batch_size < 1 or max_queue < 1 or max_queue_delay_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1, max_queue_delay_ms >= 0")
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay_ms / 1000
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()  # set while nothing is queued or running
        self._drained.set()
        self._closing = False
        self._worker: asyncio.Task | None = None
        # One inference thread: batches run one after another, in arrival order.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpulab-infer")

    @property
    def depth(self) -> int:
        """Requests waiting for a batch (not counting the one running)."""
        return len(self._queue)

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Refuse new requests, answer the queued ones (up to the timeout), then stop."""
        self._closing = True
        if self._worker is not None and not self._drained.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        for p in self._queue:
            if not p.future.done():
                p.future.set_exception(Closed("the server is shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=True)

    async def submit(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Queue one request (its arrays share dim 0, the rows); return its outputs."""
        rows = int(inputs[0].shape[0])
        if rows > self.max_batch_size:
            raise ValueError(
                f"a request of {rows} rows exceeds max batch size {self.max_batch_size}; split it"
            )
        if self._closing:
            raise Closed("the server is shutting down")
        if len(self._queue) >= self.max_queue:
            raise QueueFull(f"queue full ({self.max_queue} requests waiting); retry later")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(inputs, rows, time.monotonic(), future))
        self._drained.clear()
        self._wakeup.set()
        return await future

    async def _take_batch(self) -> list[_Pending]:
        while not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()
        deadline = self._queue[0].enqueued + self.max_queue_delay
        batch: list[_Pending] = []
        rows = 0
        while True:
            while self._queue and rows + self._queue[0].rows <= self.max_batch_size:
                p = self._queue.popleft()
                if p.future.cancelled():  # the client went away while it waited
                    continue
                batch.append(p)
                rows += p.rows
            full = rows >= self.max_batch_size or (
                self._queue and rows + self._queue[0].rows > self.max_batch_size
            )
            remaining = deadline - time.monotonic()
            if full or remaining <= 0:
                return batch
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._drained.set()
            batch = await self._take_batch()
            if not batch:
                continue
            n_inputs = len(batch[0].inputs)
            joined = [
                np.concatenate([p.inputs[i] for p in batch])
                if len(batch) > 1
                else batch[0].inputs[i]
                for i in range(n_inputs)
            ]
            rows = sum(p.rows for p in batch)
            if self.on_batch is not None:
                self.on_batch(rows)
            try:
                outputs = await loop.run_in_executor(self._executor, self.run_batch, joined)
            except Exception as exc:  # the model failed: every request in the batch learns why
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            start = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result([o[start : start + p.rows] for o in outputs])
                start += p.rows
