"""The jobs table: one row per training job, from submit to its end.

The spec itself (code, variables) lives in the job's directory; the row holds
what the queue and the API need. A change to it needs a revision in
``migrations/versions`` (see :mod:`.migrate`). Its queries are :class:`JobStore`'s,
below the table; the queue's order and admission over them live in
:mod:`gpulab.scheduler.queue`.
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
    func,
    insert,
    select,
    update,
)

from .engine import metadata, utcnow
from .store import Store, json_columns

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")


class QueueFull(Exception):
    """A user's queued jobs are at the cap; ``args[0]`` is how many are queued."""


jobs = Table(
    "gpulab_jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("name", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("priority", Integer, nullable=False, default=0),
    Column("backend", String(32), nullable=False),
    # The site's pool it runs in (c.InventorySettings.pools); NULL for jobs of before
    # pools, whose backend's kind names it.
    Column("pool", String(32)),
    Column("nodes", Integer, nullable=False),
    Column("nproc_per_node", Integer, nullable=False),
    Column("gpu_milli", Integer, nullable=False),  # per rank
    Column("submitted", DateTime(timezone=True), nullable=False),
    Column("started", DateTime(timezone=True)),
    Column("finished", DateTime(timezone=True)),
    # Why it waits (queued) or how it ended (finished); for people.
    Column("message", Text, nullable=False, default=""),
    Column("error", Text),  # JSON: {"rank", "type", "message", "traceback"}
    Column("restarts", Integer, nullable=False, default=0),
    # Preemption (scheduler/priority.py): the job's class, whether it may be
    # chosen, how often it was, and while it is being stopped for someone,
    # JSON {"for", "claim", "since", "deadline"} (so a restart finishes it).
    Column("priority_class", String(63), nullable=False, default="batch"),
    Column("preemptible", Boolean, nullable=False, default=True),
    Column("preemptions", Integer, nullable=False, default=0),
    Column("preempting", Text),
    # Elastic jobs (``--nodes MIN:MAX``; NULL for fixed ones): ``nodes`` is the size
    # now; ``resizes`` JSON [{"step", "nodes", "reason", "time"}], each change;
    # ``resizing`` JSON {"nodes", "reason", "deadline", ...} while one is under way
    # (so a restarted service finishes it).
    Column("min_nodes", Integer),
    Column("max_nodes", Integer),
    Column("resizes", Text),
    Column("resizing", Text),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_user", "user"),
)


def job_json(r) -> dict:
    """A row as the API and the queue read it: times in ISO 8601 (UTC), the JSON
    columns parsed."""
    d = dict(r._mapping)
    for k in ("submitted", "started", "finished"):
        if d[k] is not None:
            if d[k].tzinfo is None:  # SQLite drops the zone; we only store UTC
                d[k] = d[k].replace(tzinfo=dt.UTC)
            d[k] = d[k].isoformat()
    d["error"] = json.loads(d["error"]) if d["error"] else None
    for k in ("preempting", "resizing"):
        d[k] = json.loads(d[k]) if d.get(k) else None
    d["resizes"] = json.loads(d["resizes"]) if d.get("resizes") else []
    return d


#: The JSON columns a job's values may set.
_JSON = ("error", "preempting", "resizes", "resizing")


class JobStore(Store):
    def add(self, job: dict, most_queued: int | None = None) -> None:
        """A new job, queued unless ``job`` says otherwise; :class:`QueueFull` when its
        user already has ``most_queued`` jobs queued (counted in the insert's own
        transaction, so two submits at once cannot both take the last place)."""
        row = {
            "state": "queued",
            "priority": 0,
            "message": "",
            "restarts": 0,
            "submitted": utcnow(),
            **job,
        }
        with self.writing() as conn:
            if most_queued is not None:
                waiting = conn.execute(
                    select(func.count())
                    .select_from(jobs)
                    .where(jobs.c.user == row["user"], jobs.c.state == "queued")
                ).scalar_one()
                if waiting >= most_queued:
                    raise QueueFull(waiting)
            conn.execute(insert(jobs), [row])

    def get(self, job_id: str) -> dict | None:
        return self.by_id(jobs, job_id, job_json)

    def list(self, user: str | None = None, states: tuple[str, ...] | None = None) -> list[dict]:
        """Jobs in submit order, of ``user`` and in ``states`` where given."""
        q = select(jobs).order_by(jobs.c.submitted, jobs.c.id)
        if user is not None:
            q = q.where(jobs.c.user == user)
        if states:
            q = q.where(jobs.c.state.in_(states))
        return self.all(q, job_json)

    def queued_of(self, user: str) -> int:
        """How many of ``user``'s jobs wait in the queue."""
        q = select(func.count()).select_from(jobs)
        with self.reading() as conn:
            return conn.execute(q.where(jobs.c.user == user, jobs.c.state == "queued")).scalar_one()

    def newest(self, user: str | None, n: int) -> list[dict]:
        """The ``n`` jobs submitted last (of ``user`` where given), newest first."""
        q = select(jobs).order_by(jobs.c.submitted.desc(), jobs.c.id.desc()).limit(n)
        if user is not None:
            q = q.where(jobs.c.user == user)
        return self.all(q, job_json)

    def update(self, job_id: str, **values) -> None:
        self.update_by_id(jobs, job_id, json_columns(values, objects=_JSON, skip_none=True))

    def finish(self, job_id: str, state: str, message: str = "", **values) -> bool:
        """Move a job to a terminal state once; ``False`` if it already was in one."""
        assert state in TERMINAL
        values = json_columns(values, objects=("error",), skip_none=True)
        with self.writing() as conn:
            done = conn.execute(
                update(jobs)
                .where((jobs.c.id == job_id) & ~jobs.c.state.in_(TERMINAL))
                .values(state=state, message=message, finished=utcnow(), **values)
            )
            return done.rowcount == 1
