"""The jobs table: one row per training job, from submit to its end.

The spec itself (code, variables) lives in the job's directory; the row holds
what the queue and the API need. A change to it needs a revision in
``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, DateTime, Index, Integer, String, Table, Text

from .engine import metadata

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")

jobs = Table(
    "gpulab_jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("name", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("priority", Integer, nullable=False, default=0),
    Column("backend", String(32), nullable=False),
    # The site's pool it runs in (c.GpuLabService.pools); NULL for jobs of before
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
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_user", "user"),
)
