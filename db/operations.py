"""Operations' tables: the audit trail, alerts, and cordoned GPUs.

* ``gpulab_audit``: one row per change anyone made (append-only; pruned by age by
  the retention setting). ``actor`` did ``action`` to ``subject``, which belongs to
  ``user`` (the actor's own, or someone else's when an admin acts for them).
* ``gpulab_alerts``: one row per episode of an alert: it fires (``since``) and
  later resolves (``resolved_at``); a new episode is a new row. ``key`` names the
  alert's rule and subject, so at most one unresolved row per key exists.
* ``gpulab_gpu_cordons``: GPUs taken out of placement (XID/ECC errors, lost, or an
  admin's choice) until an admin uncordons them (the row is deleted).

A change to them needs a revision in ``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Index, Integer, String, Table, Text

from .engine import metadata

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
