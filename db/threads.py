"""Where blocking database calls run off the event loop: a small pool of threads.

A write waits for the database's write lock (SQLite may wait up to 30 s for another
process) and a read is a network round trip on PostgreSQL; on the event loop either
would stall every request. The ledger has a pool of its own (its writers queue on
its lock, and must not wait behind a long usage report); everything else that
queries (the audit trail, alerts, usage) shares the service's one other pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: Threads per pool: reads run side by side; more buys nothing but idle connections.
POOL_SIZE = 4


class DbThreads:
    def __init__(self, name: str = "gpulab-db", max_workers: int = POOL_SIZE):
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the threads (with the caller's context
        variables). A call whose awaiting coroutine is cancelled still finishes there."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Stop the threads once the calls in flight are done (no new calls after)."""
        self._pool.shutdown(wait=False)
