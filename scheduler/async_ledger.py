"""The ledger's face for the service's event loop: each call runs on a small thread pool.

A ledger write waits for the database's write lock (SQLite may wait up to 30 s
for another process), and a read is a network round trip on PostgreSQL; on the
event loop either would stall every other request. Get one with
``ledger.aio`` (one per :class:`~.ledger.Ledger`), then ``await
ledger.aio.allocate(...)``.

Writers in one process still queue on the ledger's own lock before the
database's, so a pool larger than a few threads buys nothing but idle
connections. A call whose awaiting coroutine is cancelled still finishes in its
thread: a placement that commits is on disk, and the owner's retry gets the same
rows back (the ledger is idempotent per owner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from gpulab.db.threads import POOL_SIZE, DbThreads

if TYPE_CHECKING:
    from .ledger import Ledger, SizeAvailability

T = TypeVar("T")


class AsyncLedger:
    """:class:`~.ledger.Ledger`'s database calls as coroutines; the rest is on ``.sync``."""

    def __init__(self, ledger: Ledger, max_workers: int = POOL_SIZE, threads=None):
        self.sync = ledger
        self._threads = threads or DbThreads("gpulab-ledger", max_workers)

    def over(self, ledger: Ledger) -> AsyncLedger:
        """The same threads for another view of the ledger (one pool's)."""
        return AsyncLedger(ledger, threads=self._threads)

    # In-memory parts, no database: read them directly.
    @property
    def quotas(self):
        return self.sync.quotas

    @property
    def gpus(self):
        return self.sync.gpus

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run any blocking work that writes through the ledger on its threads (the job
        queue's ``admit``, which places several jobs in one pass)."""
        return await self._threads.run(fn, *args, **kwargs)

    # -- reading ---------------------------------------------------------------
    async def list(
        self, user: str | None = None, owner_kind: str | None = None, owner: str | None = None
    ) -> list[dict]:
        return await self.run(self.sync.list, user=user, owner_kind=owner_kind, owner=owner)

    async def get(self, alloc_id: str) -> dict | None:
        return await self.run(self.sync.get, alloc_id)

    async def usage(self) -> dict[str, int]:
        return await self.run(self.sync.usage)

    async def allocated_by_gpu(self) -> dict[str, int]:
        return await self.run(self.sync.allocated_by_gpu)

    async def availability(
        self, user: str, sizes: Iterable[int], groups: Mapping[str, set[str]] | None = None
    ) -> list[SizeAvailability]:
        return await self.run(self.sync.availability, user, list(sizes), groups)

    async def free_sizes(self, sizes: Iterable[int]) -> dict[str, list[dict]]:
        return await self.run(self.sync.free_sizes, list(sizes))

    # -- writing ---------------------------------------------------------------
    async def allocate(
        self,
        user: str,
        owner_kind: str,
        owner: str,
        milli: int,
        groups: Mapping[str, set[str]] | None = None,
    ) -> list[dict]:
        return await self.run(self.sync.allocate, user, owner_kind, owner, milli, groups)

    async def allocate_gang(
        self,
        user: str,
        owner_kind: str,
        members: list[tuple[str, int]],
        groups: Mapping[str, set[str]] | None = None,
    ) -> list[dict]:
        return await self.run(self.sync.allocate_gang, user, owner_kind, list(members), groups)

    async def release(self, owner_kind: str, owner: str) -> list[dict]:
        return await self.run(self.sync.release, owner_kind, owner)

    async def release_id(self, alloc_id: str) -> dict | None:
        return await self.run(self.sync.release_id, alloc_id)

    async def reconcile(self, owner_kind: str, alive: set[str]) -> list[dict]:
        return await self.run(self.sync.reconcile, owner_kind, set(alive))

    def close(self) -> None:
        """Stop the threads once the calls in flight are done (no new calls after)."""
        self._threads.close()
