"""The hibernations table: one row per time a server's kernels were saved and the
server stopped to give its slice back (:mod:`gpulab.service.hibernation`).

The kernels' state itself never comes here: it lives in the user's own files
(``~/.gpulab/hibernate/<id>/``), written and read by the user's own kernels. The
row holds what the pages and the scheduler need: whose server, why, how it ended,
what was saved in numbers (kernels, bytes, names of what could not be saved) and
what each kernel said when it woke. A change to it needs a revision in
``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)

from .engine import metadata, utcnow
from .store import Store

#: saving: the server's kernels are being saved; hibernated: saved, the server
#: stopped and its slice given back; woken: every saved kernel came back;
#: failed: nothing was stopped (the server kept running), ``error`` says why.
STATES = ("saving", "hibernated", "woken", "failed")

hibernations = Table(
    "gpulab_hibernations",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("server", String(255), nullable=False),  # "" for the default server
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),  # for people: "asked by alice", "idle for 30 min"
    Column("actor", String(255), nullable=False),  # who asked: a user, or "gpulab"
    Column("gpu_milli", Integer, nullable=False),  # the slice the server gave back
    Column("created", DateTime(timezone=True), nullable=False),
    Column("finished", DateTime(timezone=True)),  # hibernated or failed at
    Column("woken_at", DateTime(timezone=True)),
    Column("kernels", Integer, nullable=False, default=0),
    Column("bytes", BigInteger, nullable=False, default=0),
    Column("error", Text),
    # JSON {"kernels": [{name, notebook, saved, skipped, bytes}], "wakes": [...]}
    Column("detail", Text, nullable=False, default="{}"),
    Index("ix_hibernations_user", "user", "server"),
)


def _iso(ts: dt.datetime | None) -> str | None:
    if ts is None:
        return None
    if ts.tzinfo is None:  # SQLite gives naive UTC back
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def row_json(row) -> dict:
    """A row as the API shows it (times in ISO 8601 UTC, ``detail`` unpacked)."""
    r = dict(row._mapping)
    try:
        detail = json.loads(r.pop("detail") or "{}")
    except ValueError:
        detail = {}
    for key in ("created", "finished", "woken_at"):
        r[key] = _iso(r[key])
    r["kernel_states"] = detail.get("kernels") or []
    r["wakes"] = detail.get("wakes") or []
    return r


class HibernationStore(Store):
    def add(self, id: str, user: str, server: str, reason: str, actor: str, gpu_milli: int) -> dict:
        """A new row in state ``saving``."""
        values = {
            "id": id,
            "user": user,
            "server": server,
            "state": "saving",
            "reason": reason,
            "actor": actor,
            "gpu_milli": gpu_milli,
            "created": utcnow(),
            "kernels": 0,
            "bytes": 0,
            "detail": "{}",
        }
        with self.writing() as conn:
            conn.execute(insert(hibernations).values(**values))
        return self.get(id)

    def get(self, id: str) -> dict | None:
        return self.by_id(hibernations, id, row_json)

    def list(
        self,
        user: str | None = None,
        server: str | None = None,
        states: tuple[str, ...] | None = None,
        limit: int = 100,
    ) -> list[dict]:
        """Newest first; ``user`` None: everyone's."""
        t = hibernations
        q = select(t).order_by(t.c.created.desc(), t.c.id.desc()).limit(limit)
        if user is not None:
            q = q.where(t.c.user == user)
        if server is not None:
            q = q.where(t.c.server == server)
        if states:
            q = q.where(t.c.state.in_(states))
        return self.all(q, row_json)

    def finish(
        self,
        id: str,
        state: str,
        *,
        kernels: list[dict] | None = None,
        total_bytes: int = 0,
        error: str | None = None,
    ) -> dict | None:
        """A saving row ends: ``hibernated`` (with what each kernel saved) or ``failed``."""
        detail = {"kernels": kernels or [], "wakes": []}
        values = {
            "state": state,
            "finished": utcnow(),
            "kernels": len(kernels or []),
            "bytes": int(total_bytes),
            "error": error,
            "detail": json.dumps(detail),
        }
        self.update_by_id(hibernations, id, values)
        return self.get(id)

    def add_wake(self, id: str, wake: dict) -> dict | None:
        """One kernel came back: its report is kept; once every saved kernel has
        reported (or one reported twice: a notebook woken again by hand) the row is
        ``woken``."""
        t = hibernations
        with self.writing() as conn:
            row = conn.execute(select(t).where(t.c.id == id)).first()
            if row is None:
                return None
            detail = json.loads(row.detail or "{}")
            wakes = [w for w in detail.get("wakes") or [] if w.get("name") != wake.get("name")]
            wakes.append(wake)
            detail["wakes"] = wakes
            names = {k.get("name") for k in detail.get("kernels") or []}
            values = {"detail": json.dumps(detail)}
            if row.state == "hibernated" and names <= {w.get("name") for w in wakes}:
                values.update(state="woken", woken_at=utcnow())
            conn.execute(update(t).where(t.c.id == id).values(**values))
        return self.get(id)

    def fail_unfinished(self, error: str) -> int:
        """Rows left ``saving`` by a service that stopped mid-way: ``failed`` (the server
        was not stopped by this service; the user asks again)."""
        with self.writing() as conn:
            return (
                conn.execute(
                    update(hibernations)
                    .where(hibernations.c.state == "saving")
                    .values(state="failed", finished=utcnow(), error=error)
                ).rowcount
                or 0
            )
