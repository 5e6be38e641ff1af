"""The allocation ledger's queries: who holds which share of which GPU, and which GPUs
are cordoned.

The tables are ``gpulab_allocations`` (:data:`.engine.allocations`), ``gpulab_usage``
(:mod:`.usage`: a released slice's row, written in the transaction that releases it)
and ``gpulab_gpu_cordons`` (:mod:`.operations`). What to place where, quotas and the
in-process lock are the scheduler's (:mod:`gpulab.scheduler.ledger`); it opens a
:meth:`LedgerStore.transaction` and runs these queries in it, so a placement's read
and insert are one transaction under the database-wide write lock.
"""

from __future__ import annotations

import datetime as dt
from contextlib import AbstractContextManager, contextmanager, nullcontext

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection

from .engine import allocations, lock_for_write, utcnow
from .operations import gpu_cordons
from .store import Store
from .usage import closed_row, usage


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value  # SQLite drops it


def allocation_json(row) -> dict:
    """An allocation row as the API shows it (``created`` in ISO 8601, UTC)."""
    d = dict(row._mapping)
    d["created"] = _utc(d["created"]).isoformat()
    return d


def cordon_json(row) -> dict:
    """A cordon as the API shows it: {"reason", "by", "since" (ISO 8601, UTC), "node"}."""
    return {
        "reason": row.reason,
        "by": row.by,
        "since": _utc(row.since).isoformat().replace("+00:00", "Z"),
        "node": row.node,
    }


class LedgerStore(Store):
    """The ledger's rows. Reads take ``conn`` to run inside a placement's transaction
    (None: a connection of their own)."""

    @contextmanager
    def transaction(self):
        """A write transaction holding the database-wide write lock (one writer among
        every service process sharing the database)."""
        with self.writing() as conn:
            lock_for_write(conn)
            yield conn

    def _on(self, conn: Connection | None) -> AbstractContextManager[Connection]:
        return nullcontext(conn) if conn is not None else self.reading()

    # -- allocations ------------------------------------------------------------------
    def list(
        self, user: str | None = None, owner_kind: str | None = None, owner: str | None = None
    ) -> list[dict]:
        q = select(allocations).order_by(allocations.c.created, allocations.c.id)
        if user is not None:
            q = q.where(allocations.c.user == user)
        if owner_kind is not None:
            q = q.where(allocations.c.owner_kind == owner_kind)
        if owner is not None:
            q = q.where(allocations.c.owner == owner)
        return self.all(q, allocation_json)

    def get(self, alloc_id: str) -> dict | None:
        return self.by_id(allocations, alloc_id, allocation_json)

    def held_by_user(self, conn: Connection | None = None) -> dict[str, int]:
        """Milli-GPU held per user."""
        q = select(allocations.c.user, func.sum(allocations.c.milli)).group_by(allocations.c.user)
        with self._on(conn) as c:
            return {u: int(m) for u, m in c.execute(q)}

    def held_by_gpu(self, conn: Connection | None = None) -> dict[str, int]:
        """Milli-GPU held per GPU UUID."""
        q = select(allocations.c.gpu_uuid, func.sum(allocations.c.milli)).group_by(
            allocations.c.gpu_uuid
        )
        with self._on(conn) as c:
            return {g: int(m) for g, m in c.execute(q)}

    def owner_rows(self, conn: Connection, owner_kind: str, owner: str) -> list[dict]:
        """What ``owner`` holds now, in the transaction ``conn``."""
        cond = (allocations.c.owner_kind == owner_kind) & (allocations.c.owner == owner)
        return [allocation_json(r) for r in conn.execute(select(allocations).where(cond))]

    def insert(self, conn: Connection, rows: list[dict]) -> None:
        conn.execute(insert(allocations), rows)

    def release(self, conn: Connection, owner_kind: str, owner: str) -> list[dict]:
        """Delete what ``owner`` holds and write each slice's GPU time to the usage table
        in the same transaction (never lost, never twice); the released rows."""
        cond = (allocations.c.owner_kind == owner_kind) & (allocations.c.owner == owner)
        held = conn.execute(select(allocations).where(cond)).all()
        conn.execute(delete(allocations).where(cond))
        if held:
            now = utcnow()
            conn.execute(insert(usage), [closed_row(r._mapping, now) for r in held])
        return [allocation_json(r) for r in held]

    # -- cordons ----------------------------------------------------------------------
    def cordons(self, conn: Connection | None = None) -> dict[str, dict]:
        """Cordoned GPUs: UUID -> :func:`cordon_json`, the oldest first."""
        q = select(gpu_cordons).order_by(gpu_cordons.c.since)
        with self._on(conn) as c:
            return {r.gpu_uuid: cordon_json(r) for r in c.execute(q)}

    def cordon(
        self, conn: Connection, gpu_uuid: str, node: str, reason: str, by: str
    ) -> tuple[dict, bool]:
        """The GPU's cordon, and whether this call made it (a cordon already there keeps
        its first reason)."""
        cond = gpu_cordons.c.gpu_uuid == gpu_uuid
        row = conn.execute(select(gpu_cordons).where(cond)).first()
        if row is not None:
            return cordon_json(row), False
        conn.execute(
            insert(gpu_cordons).values(
                gpu_uuid=gpu_uuid, node=node, reason=reason, by=by, since=utcnow()
            )
        )
        return cordon_json(conn.execute(select(gpu_cordons).where(cond)).one()), True

    def uncordon(self, conn: Connection, gpu_uuid: str) -> dict | None:
        """Delete the GPU's cordon; the one it had, or None."""
        cond = gpu_cordons.c.gpu_uuid == gpu_uuid
        row = conn.execute(select(gpu_cordons).where(cond)).first()
        conn.execute(delete(gpu_cordons).where(cond))
        return cordon_json(row) if row is not None else None
