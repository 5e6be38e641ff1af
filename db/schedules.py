"""Scheduled jobs: a job spec the service submits on a cron schedule, as its owner.

Jupyter Scheduler's job definitions with a schedule live here rather than in the
user's server, so that nightly retraining runs while the server is stopped: the
service's loop (:mod:`gpulab.service.jobs.schedules`) submits the stored spec when
``next_run`` has come (by :mod:`.clock`, so a test's fake clock fires it), and
records each job it submitted in ``gpulab_schedule_runs``. A change to these
tables needs a revision in ``migrations/versions``.
"""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)

from .engine import lock_for_write, metadata, utcnow
from .store import Store, json_columns

schedules = Table(
    "gpulab_schedules",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    # The name people gave it (Jupyter Scheduler's job definition name), any text.
    Column("name", String(255), nullable=False),
    Column("schedule", String(255), nullable=False),  # cron, five fields
    Column("timezone", String(64), nullable=False, default="UTC"),
    Column("active", Boolean, nullable=False, default=True),
    # JSON: the body of POST /jobs the service submits at each run.
    Column("job", Text, nullable=False),
    # JSON: what the client keeps with it (a notebook job's definition: its output
    # formats, parameters...), returned as given.
    Column("meta", Text, nullable=False, default="{}"),
    Column("created", DateTime(timezone=True), nullable=False),
    # When the hub made the owner (its user model's ``created``) as the schedule was
    # made: a later user given the name (deleted, then made again) is not its owner.
    # NULL for schedules made before it was kept, or where the hub did not say.
    Column("owner_created", DateTime(timezone=True)),
    Column("next_run", DateTime(timezone=True)),
    Column("last_run", DateTime(timezone=True)),
    # Why the last run could not be submitted (the job manager's refusal), or NULL.
    Column("last_error", Text),
    Index("ix_schedules_user", "user"),
    Index("ix_schedules_next_run", "next_run"),
)

schedule_runs = Table(
    "gpulab_schedule_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("schedule_id", String(32), nullable=False),
    Column("job_id", String(32), nullable=False),
    Column("fired", DateTime(timezone=True), nullable=False),
    Index("ix_schedule_runs_schedule", "schedule_id"),
)


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite drops the zone; we only store UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.isoformat()


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def schedule_json(r) -> dict:
    """A row as the API shows it: times in ISO 8601 (UTC), the JSON columns parsed
    (a listing's rows have ``job_bytes`` instead of ``job``)."""
    d = dict(r._mapping)
    for k in ("created", "next_run", "last_run", "owner_created"):
        if k in d:
            d[k] = _iso(d[k])
    if "job" in d:
        d["job"] = json.loads(d["job"])
    d["meta"] = json.loads(d["meta"] or "{}")
    return d


class OverLimit(Exception):
    """A user's schedules would be more than they may keep; ``args``: what they have."""


#: What a schedule takes, as stored: its JSON columns' characters (ASCII: bytes).
_SIZE = func.length(schedules.c.job) + func.coalesce(func.length(schedules.c.meta), 0)


def stored_size(row: dict) -> int:
    """The bytes a schedule's job and meta take as stored (``json_columns``' text)."""
    encoded = json_columns(
        {"job": row["job"], "meta": row.get("meta") or {}}, objects=("job", "meta")
    )
    return len(encoded["job"]) + len(encoded["meta"])


class ScheduleStore(Store):
    def add(self, row: dict, *, max_count: int, max_bytes: int) -> None:
        """Add ``row`` unless its user would then keep more than ``max_count``
        schedules or ``max_bytes`` of them (counted in the write's transaction, so two
        requests at once cannot both pass): then :class:`OverLimit`."""
        row = json_columns({**row, "meta": row.get("meta") or {}}, objects=("job", "meta"))
        row.setdefault("created", utcnow())
        size = len(row["job"]) + len(row["meta"])
        with self.writing() as conn:
            # On PostgreSQL the count and the insert are one writer's at a time, as on
            # SQLite (BEGIN IMMEDIATE): two requests at once cannot both pass the cap.
            lock_for_write(conn)
            count, used = self._usage(conn, row["user"])
            if count + 1 > max_count or used + size > max_bytes:
                raise OverLimit(count, used)
            conn.execute(insert(schedules), [row])

    def _usage(self, conn, user: str, excluding: str | None = None) -> tuple[int, int]:
        """How many schedules ``user`` keeps and their bytes, but ``excluding``'s."""
        q = select(func.count(), func.coalesce(func.sum(_SIZE), 0)).where(schedules.c.user == user)
        if excluding is not None:
            q = q.where(schedules.c.id != excluding)
        count, used = conn.execute(q).one()
        return int(count), int(used)

    def get(self, schedule_id: str) -> dict | None:
        return self.by_id(schedules, schedule_id, schedule_json)

    def list(self, user: str | None = None) -> list[dict]:
        """Schedules in the order they were made, of ``user`` where given, each with
        ``job_bytes`` (its job's size as stored) in place of the job: the bodies of
        every schedule listed could be GiBs (``get`` has one's)."""
        kept = [c for c in schedules.c if c.name != "job"]
        q = select(*kept, func.length(schedules.c.job).label("job_bytes"))
        if user is not None:
            q = q.where(schedules.c.user == user)
        return self.all(q.order_by(schedules.c.created, schedules.c.id), schedule_json)

    def due(self, now: dt.datetime) -> list[dict]:
        """Active schedules whose next run has come."""
        q = (
            select(schedules)
            .where(schedules.c.active & (schedules.c.next_run <= now))
            .order_by(schedules.c.next_run, schedules.c.id)
        )
        return self.all(q, schedule_json)

    def claim(self, sched: dict, following: dt.datetime, now: dt.datetime) -> dict | None:
        """Take the run of ``sched`` (a row :meth:`due` gave) that is due: its next run
        moved to ``following`` and its last run to ``now``, only if it is still active
        and unchanged since it was read (its next run, cron and time zone); then the row
        as it is now (its job the one to submit), else None: paused, deleted, changed
        or taken meanwhile, and nothing is submitted."""
        was = _utc(dt.datetime.fromisoformat(sched["next_run"]))
        q = (
            update(schedules)
            .where(
                (schedules.c.id == sched["id"])
                & schedules.c.active
                & (schedules.c.next_run == was)
                & (schedules.c.schedule == sched["schedule"])
                & (schedules.c.timezone == sched["timezone"])
            )
            .values(next_run=following, last_run=now)
        )
        with self.writing() as conn:
            if conn.execute(q).rowcount != 1:
                return None
            row = conn.execute(select(schedules).where(schedules.c.id == sched["id"])).first()
        return schedule_json(row) if row else None

    def put_back(self, schedule_id: str, taken: dt.datetime, retry: dt.datetime, error: str):
        """A claimed run that could not be submitted (the hub did not answer) is due
        again at ``retry``, unless the schedule changed since it was claimed (its next
        run no longer ``taken``)."""
        q = (
            update(schedules)
            .where((schedules.c.id == schedule_id) & (schedules.c.next_run == _utc(taken)))
            .values(next_run=retry, last_error=error)
        )
        with self.writing() as conn:
            conn.execute(q)

    def update(self, schedule_id: str, **values) -> None:
        self.update_by_id(schedules, schedule_id, json_columns(values, objects=("job", "meta")))

    def replace(self, schedule_id: str, user: str, values: dict, *, max_bytes: int) -> None:
        """Set a schedule's fields (``job`` and ``meta`` among them) unless it grows and
        its user's schedules would then take more than ``max_bytes``: then
        :class:`OverLimit`. One that does not grow is always saved (a user over a cap
        an admin lowered can still pause or rename their schedules)."""
        encoded = json_columns(values, objects=("job", "meta"))
        size = len(encoded["job"]) + len(encoded["meta"])
        with self.writing() as conn:
            lock_for_write(conn)  # as in add: one writer's count at a time
            count, used = self._usage(conn, user, excluding=schedule_id)
            now = conn.execute(select(_SIZE).where(schedules.c.id == schedule_id)).scalar()
            if used + size > max_bytes and size > (now or 0):
                raise OverLimit(count, used)
            conn.execute(update(schedules).where(schedules.c.id == schedule_id).values(**encoded))

    def remove(self, schedule_id: str) -> None:
        """The schedule and its list of runs (the jobs themselves stay, as they ended)."""
        with self.writing() as conn:
            conn.execute(delete(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id))
            conn.execute(delete(schedules).where(schedules.c.id == schedule_id))

    # -- runs ------------------------------------------------------------------------
    def add_run(self, schedule_id: str, job_id: str, fired: dt.datetime) -> None:
        row = {"schedule_id": schedule_id, "job_id": job_id, "fired": fired}
        with self.writing() as conn:
            conn.execute(insert(schedule_runs), [row])

    def runs(self, schedule_id: str) -> list[dict]:
        """``[{"job_id", "fired"}]`` of a schedule, oldest first."""
        q = (
            select(schedule_runs)
            .where(schedule_runs.c.schedule_id == schedule_id)
            .order_by(schedule_runs.c.fired, schedule_runs.c.id)
        )
        return self.all(q, lambda r: {"job_id": r.job_id, "fired": _iso(r.fired)})
