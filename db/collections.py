"""The vector collections table: one row per collection a user made.

The vectors themselves live in the vector engine (FAISS behind gpulab's log in the
data dir, or a Milvus cluster), one engine database per owner; this row is what the service decides
with: owner, name, dimension, metric, the embedding endpoint it names, sharing, and
where it came from (``lineage``: who made it and when, the embedding endpoint's
version and that version's own lineage). A dropped collection's row is deleted in the
step that drops it from the engine, so a name can be used again. A change here needs
a revision in ``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import json

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine

from .engine import metadata, utcnow, writer

collections = Table(
    "gpulab_collections",
    metadata,
    Column("id", String(32), primary_key=True),  # the engine's collection name
    Column("user", String(255), nullable=False),
    Column("name", String(63), nullable=False),
    Column("dim", Integer, nullable=False),
    Column("metric", String(16), nullable=False),  # "cosine", "l2" or "ip"
    Column("index_type", String(16), nullable=False),  # "hnsw" or "flat"
    Column("embed", String(255)),  # "owner/name" of an embedding endpoint, or NULL
    Column("share_users", Text, nullable=False, default="[]"),  # JSON list
    Column("share_groups", Text, nullable=False, default="[]"),  # JSON list
    Column("lineage", Text, nullable=False, default="{}"),  # JSON object
    Column("created", DateTime(timezone=True), nullable=False),
    UniqueConstraint("user", "name", name="one_collection_name_per_user"),
    Index("ix_collections_user", "user"),
)

_LISTS = ("share_users", "share_groups")


def _row(r) -> dict:
    d = dict(r._mapping)
    d["created"] = d["created"].isoformat()
    for k in _LISTS:
        d[k] = json.loads(d[k] or "[]")
    d["lineage"] = json.loads(d["lineage"] or "{}")
    return d


class CollectionNameTaken(Exception):
    """The user already has a collection of that name."""


class CollectionStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, row: dict) -> dict:
        row = {"created": utcnow(), "lineage": {}, "share_users": [], "share_groups": [], **row}
        for k in _LISTS:
            row[k] = json.dumps(sorted(row[k]))
        row["lineage"] = json.dumps(row["lineage"])
        with writer(self.engine).begin() as conn:
            taken = conn.execute(
                select(collections.c.id).where(
                    (collections.c.user == row["user"]) & (collections.c.name == row["name"])
                )
            ).first()
            if taken:
                raise CollectionNameTaken(row["name"])
            conn.execute(insert(collections), [row])
        return self.get(row["id"])

    def get(self, cid: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(collections).where(collections.c.id == cid)).first()
        return _row(r) if r else None

    def find(self, user: str, name: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                select(collections).where(
                    (collections.c.user == user) & (collections.c.name == name)
                )
            ).first()
        return _row(r) if r else None

    def list(self, user: str | None = None) -> list[dict]:
        """Every collection (``user``'s with a name), by owner and name."""
        q = select(collections).order_by(collections.c.user, collections.c.name)
        if user is not None:
            q = q.where(collections.c.user == user)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def update(self, cid: str, **values) -> None:
        for k in _LISTS:
            if k in values:
                values[k] = json.dumps(sorted(values[k]))
        if "lineage" in values:
            values["lineage"] = json.dumps(values["lineage"])
        with self.engine.begin() as conn:
            conn.execute(update(collections).where(collections.c.id == cid).values(**values))

    def remove(self, cid: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(collections).where(collections.c.id == cid))
