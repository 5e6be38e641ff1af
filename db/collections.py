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
)

from .engine import metadata, utcnow
from .store import Store, json_columns

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


def _encoded(values: dict) -> dict:
    return json_columns(values, lists=_LISTS, objects=("lineage",))


class CollectionNameTaken(Exception):
    """The user already has a collection of that name."""


class CollectionStore(Store):
    def add(self, row: dict) -> dict:
        row = {"created": utcnow(), "lineage": {}, "share_users": [], "share_groups": [], **row}
        with self.writing() as conn:
            self.insert_named(conn, collections, _encoded(row), CollectionNameTaken)
        return self.get(row["id"])

    def get(self, cid: str) -> dict | None:
        return self.by_id(collections, cid, _row)

    def find(self, user: str, name: str) -> dict | None:
        return self.by_name(collections, user, name, _row)

    def list(self, user: str | None = None) -> list[dict]:
        """Every collection (``user``'s with a name), by owner and name."""
        return self.of_user(collections, user, (collections.c.user, collections.c.name), _row)

    def update(self, cid: str, **values) -> None:
        self.update_by_id(collections, cid, _encoded(values))

    def remove(self, cid: str) -> None:
        self.delete_where(collections, collections.c.id == cid)
