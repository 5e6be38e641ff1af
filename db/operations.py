"""Operations' tables: the audit trail, alerts, and cordoned GPUs.

* ``gpulab_audit``: one row per change anyone made (append-only; pruned by age by
  the retention setting). ``actor`` did ``action`` to ``subject``, which belongs to
  ``user`` (the actor's own, or someone else's when an admin acts for them).
* ``gpulab_alerts``: one row per episode of an alert: it fires (``since``) and
  later resolves (``resolved_at``); a new episode is a new row. ``key`` names the
  alert's rule and subject, so at most one unresolved row per key exists.
* ``gpulab_gpu_cordons``: GPUs taken out of placement (XID/ECC errors, lost, or an
  admin's choice) until an admin uncordons them (the row is deleted).

The audit trail's and the alerts' queries live here beside their tables
(:class:`AuditStore`, :class:`AlertStore`; the cordons' are the ledger's,
:class:`gpulab.db.ledger.LedgerStore`; what the entries and alerts mean is the
service's: :mod:`gpulab.service.operations.audit`, :mod:`gpulab.service.operations.alerts`).
A change to the tables needs a revision in
``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    delete,
    insert,
    or_,
    select,
    update,
)

from .engine import metadata
from .store import Store

audit = Table(
    "gpulab_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", DateTime(timezone=True), nullable=False),
    Column("actor", String(255), nullable=False),
    # "user", "admin", "service" (another hub service) or "system" (gpulab itself)
    Column("actor_kind", String(16), nullable=False),
    Column("user", String(255)),  # whose thing it is (None: nobody's, e.g. a GPU)
    Column("action", String(64), nullable=False),  # "job.submit", "server.start"...
    Column("subject", String(255), nullable=False),
    Column("source", String(255), nullable=False),  # the client's address, or "gpulab"
    Column("result", String(16), nullable=False),  # "ok", "denied", "failed"
    Column("detail", Text, nullable=False),  # JSON object, small
    Index("ix_audit_ts", "ts"),
    Index("ix_audit_user", "user"),
    Index("ix_audit_actor", "actor"),
)

alerts = Table(
    "gpulab_alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(400), nullable=False),  # "<rule>|<subject>"
    Column("name", String(64), nullable=False),
    Column("severity", String(16), nullable=False),  # "critical", "warning", "info"
    Column("subject_kind", String(16), nullable=False),  # "gpu", "job", "deployment"...
    Column("subject", String(255), nullable=False),
    Column("owner", String(255)),  # the user it is about (None: admins only)
    Column("message", Text, nullable=False),
    Column("labels", Text, nullable=False),  # JSON object
    Column("since", DateTime(timezone=True), nullable=False),
    Column("resolved_at", DateTime(timezone=True)),
    Column("updated", DateTime(timezone=True), nullable=False),
    # Its owner or an admin has seen it: it no longer counts as firing (the badge, the
    # status line); an alert about an event (a failed job) resolves with it.
    Column("acknowledged_at", DateTime(timezone=True)),
    Column("acknowledged_by", String(255)),
    Index("ix_alerts_key", "key"),
    Index("ix_alerts_owner", "owner"),
    Index("ix_alerts_resolved", "resolved_at"),
)

gpu_cordons = Table(
    "gpulab_gpu_cordons",
    metadata,
    Column("gpu_uuid", String(96), primary_key=True),
    Column("node", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("by", String(255), nullable=False),  # an admin's name, or "gpulab"
    Column("since", DateTime(timezone=True), nullable=False),
)


# -- the alerts' queries ------------------------------------------------------------------
def iso(ts: dt.datetime | None) -> str | None:
    """``2026-12-01T10:00:00Z`` (UTC, seconds)."""
    return None if ts is None else utc(ts).strftime("%Y-%m-%dT%H:%M:%SZ")


def alert_json(row) -> dict:
    """A ``gpulab_alerts`` row as ``GET /alerts`` shows it."""
    r = row._mapping if hasattr(row, "_mapping") else row
    try:
        labels = json.loads(r["labels"] or "{}")
    except ValueError:
        labels = {}
    return {
        "id": r["id"],
        "name": r["name"],
        "severity": r["severity"],
        "state": "resolved" if r["resolved_at"] is not None else "firing",
        "subject_kind": r["subject_kind"],
        "subject": r["subject"],
        "owner": r["owner"],
        "since": iso(r["since"]),
        "resolved_at": iso(r["resolved_at"]),
        "acknowledged_at": iso(r.get("acknowledged_at")),
        "acknowledged_by": r.get("acknowledged_by"),
        "message": r["message"],
        "labels": labels,
    }


#: Most rows one listing of alerts returns (the newest).
ALERTS_LIST_LIMIT = 1000


class AlertStore(Store):
    def list(
        self,
        owner: str | None,
        state: str = "all",
        since: dt.datetime | None = None,
        limit: int = ALERTS_LIST_LIMIT,
    ) -> tuple[list[dict], int]:
        """Alerts that fired at some time after ``since`` (still firing, or resolved
        after it), the newest ``limit`` first, of ``owner`` (None: everyone's); and how
        many of that owner's fire now and are not acknowledged."""
        t = alerts
        q = select(t).order_by(t.c.since.desc(), t.c.id.desc()).limit(limit)
        count = select(t.c.id).where(and_(t.c.resolved_at.is_(None), t.c.acknowledged_at.is_(None)))
        if owner is not None:
            q = q.where(t.c.owner == owner)
            count = count.where(t.c.owner == owner)
        if since is not None:
            q = q.where(or_(t.c.resolved_at.is_(None), t.c.resolved_at >= since))
        if state == "firing":
            q = q.where(t.c.resolved_at.is_(None))
        elif state == "resolved":
            q = q.where(t.c.resolved_at.is_not(None))
        with self.reading() as conn:
            rows = [alert_json(r) for r in conn.execute(q)]
            firing = len(conn.execute(count).all())
        return rows, firing

    def open(self) -> list:
        """The rows (not dicts: the engine reads ``.key``) of the alerts still firing."""
        with self.reading() as conn:
            return conn.execute(select(alerts).where(alerts.c.resolved_at.is_(None))).all()

    def get(self, alert_id: int):
        """One alert's row (its columns as attributes), or None."""
        with self.reading() as conn:
            return conn.execute(select(alerts).where(alerts.c.id == alert_id)).first()

    def acknowledge(self, alert_id: int, by: str, at: dt.datetime, resolve: bool):
        """Mark an alert seen by ``by`` at ``at`` (the first acknowledgement counts), and
        resolve it with ``resolve`` if it still fires; its row afterwards (None: no such)."""
        t = alerts
        with self.writing() as conn:
            conn.execute(
                update(t)
                .where(and_(t.c.id == alert_id, t.c.acknowledged_at.is_(None)))
                .values(acknowledged_at=at, acknowledged_by=by, updated=at)
            )
            if resolve:
                conn.execute(
                    update(t)
                    .where(and_(t.c.id == alert_id, t.c.resolved_at.is_(None)))
                    .values(resolved_at=at, updated=at)
                )
            return conn.execute(select(t).where(t.c.id == alert_id)).first()

    def acknowledged_keys(self, since: dt.datetime) -> set[str]:
        """Keys of the alerts resolved by an acknowledgement since ``since``: their
        findings may still hold (a failed job stays failed), and must not fire them again."""
        t = alerts
        with self.reading() as conn:
            rows = conn.execute(
                select(t.c.key).where(
                    and_(
                        t.c.acknowledged_at.is_not(None),
                        t.c.resolved_at == t.c.acknowledged_at,
                        t.c.resolved_at >= since,
                    )
                )
            ).all()
        return {r.key for r in rows}

    def write_round(
        self,
        at: dt.datetime,
        fire: list[dict],
        changed: list[tuple[int, dict]],
        resolve: list[int],
        prune_before: dt.datetime | None = None,
    ) -> tuple[list[dict], int]:
        """One round of the alert engine, in one transaction: each row of ``fire``
        inserted (an unresolved row of the same key resolved first: one per key, even
        when two services raced), ``changed`` rows (id, new values) updated, ``resolve``
        rows resolved at ``at``, and rows resolved before ``prune_before`` deleted. The
        fired rows as ``GET /alerts`` shows them, and how many rows were pruned."""
        t = alerts
        fired = []
        pruned = 0
        with self.writing() as conn:
            for row in fire:
                conn.execute(
                    update(t)
                    .where(and_(t.c.key == row["key"], t.c.resolved_at.is_(None)))
                    .values(resolved_at=at, updated=at)
                )
                row_id = conn.execute(insert(t).values(**row, updated=at)).inserted_primary_key[0]
                fired.append(alert_json({**row, "id": row_id}))
            for row_id, values in changed:
                conn.execute(update(t).where(t.c.id == row_id).values(**values, updated=at))
            for row_id in resolve:
                conn.execute(update(t).where(t.c.id == row_id).values(resolved_at=at, updated=at))
            if prune_before is not None:
                pruned = (
                    conn.execute(
                        delete(t).where(
                            and_(t.c.resolved_at.is_not(None), t.c.resolved_at < prune_before)
                        )
                    ).rowcount
                    or 0
                )
        return fired, pruned


# -- the audit trail's queries ------------------------------------------------------------
@dataclass
class AuditFilters:
    """What ``GET /audit`` narrows to; None: any."""

    user: str | None = None
    actor: str | None = None
    action: str | None = None  # exact, or a prefix ending in ".*" ("deployment.*")
    subject: str | None = None
    result: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


def utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC (SQLite drops the zone; gpulab stores UTC)."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def audit_json(row) -> dict:
    """A ``gpulab_audit`` row as ``GET /audit`` shows it."""
    d = dict(row._mapping)
    d["ts"] = utc(d["ts"]).isoformat()
    try:
        d["detail"] = json.loads(d["detail"])
    except ValueError:
        d["detail"] = {}
    return d


class AuditStore(Store):
    def add(self, values: dict) -> int:
        """Append one entry (the table's columns) and commit it; its id."""
        with self.writing() as conn:
            return conn.execute(insert(audit).values(**values)).inserted_primary_key[0]

    def read(
        self,
        filters: AuditFilters,
        only_of: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> tuple[list[dict], int | None]:
        """Entries that match ``filters``, newest first (those of ``only_of``, as owner or
        actor, when it names someone), below ``before_id``; and the ``before_id`` of the
        next page (None: this was the last)."""
        q = select(audit)
        if only_of is not None:
            q = q.where(or_(audit.c.user == only_of, audit.c.actor == only_of))
        f = filters
        if f.user is not None:
            q = q.where(audit.c.user == f.user)
        if f.actor is not None:
            q = q.where(audit.c.actor == f.actor)
        if f.action is not None:
            if f.action.endswith(".*"):
                q = q.where(audit.c.action.startswith(f.action[:-1], autoescape=True))
            else:
                q = q.where(audit.c.action == f.action)
        if f.subject is not None:
            q = q.where(audit.c.subject == f.subject)
        if f.result is not None:
            q = q.where(audit.c.result == f.result)
        if f.since is not None:
            q = q.where(audit.c.ts >= f.since)
        if f.until is not None:
            q = q.where(audit.c.ts < f.until)
        if before_id is not None:
            q = q.where(audit.c.id < before_id)
        rows = self.all(q.order_by(audit.c.id.desc()).limit(limit + 1), audit_json)
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1]["id"] if more and rows else None)

    def prune(self, before: dt.datetime) -> int:
        """Delete the entries older than ``before``; how many went."""
        return self.delete_where(audit, audit.c.ts < before)
