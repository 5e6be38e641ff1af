"""The usage table: GPU time that allocations held, one row per released slice.

A slice that is still held is counted from the allocations table (``created``
to now); when it is released, the same transaction that deletes it writes its
row here, so the total never drops or double counts across a crash or restart.
A change to it needs a revision in ``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Index, Integer, String, Table

from .engine import metadata

usage = Table(
    "gpulab_usage",
    metadata,
    Column("id", String(32), primary_key=True),  # the allocation's id
    Column("user", String(255), nullable=False),
    Column("owner_kind", String(16), nullable=False),
    Column("owner", String(255), nullable=False),
    Column("gpu_uuid", String(96), nullable=False),
    Column("milli", Integer, nullable=False),
    Column("started", DateTime(timezone=True), nullable=False),
    Column("ended", DateTime(timezone=True), nullable=False),
    # milli x seconds held, so totals are one SUM (the metrics counter)
    Column("milli_seconds", BigInteger, nullable=False),
    Index("ix_usage_ended", "ended"),
    Index("ix_usage_user", "user"),
)
