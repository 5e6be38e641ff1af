"""The collections an older gpulab kept in Milvus Lite, copied into the FAISS engine at
its first start, without losing a row.

The old engine's data is ``DATA_DIR`` itself (``databases/u_<owner hash>/collections/
c<id>/``). It is opened with Milvus Lite (in this process, for the minute of the
copy) and every row (id, vector, metadata) of every collection is read in pages, in
id order, and written into a new collection of the same name (the service's row id)
and database (the owner's). A collection counts as copied only once it holds as many
rows as the old one; a start cut short copies it again. The old files are left where
they are (a downgrade still finds them) and ``MIGRATED`` in the new folder says the
copy is done.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from .embedded_store import Store

log = logging.getLogger("gpulab.service.vectors.engine")

MARKER = "MIGRATED"
PAGE = 2000
METRICS = {"COSINE": "cosine", "L2": "l2", "IP": "ip"}


def old_data(data_dir: str) -> bool:
    return os.path.isdir(os.path.join(data_dir, "databases")) or os.path.isdir(
        os.path.join(data_dir, "collections")
    )


def migrate(data_dir: str, store: Store) -> int:
    """Copy what Milvus Lite holds in ``data_dir`` into ``store`` once; the rows copied."""
    marker = os.path.join(store.root, MARKER)
    if os.path.exists(marker):
        return 0
    copied = 0
    if old_data(data_dir):
        copied = migrate_from(data_dir, store)
    with open(marker, "w") as f:
        json.dump({"rows": copied}, f)
        f.flush()
        os.fsync(f.fileno())
    return copied


def migrate_from(data_dir: str, store: Store) -> int:
    from milvus_lite.db import MilvusLite

    db = MilvusLite(data_dir)
    copied = 0
    try:
        for database in db.list_databases():
            if not database.startswith("u_"):
                continue  # not a database the service made
            for cid in db.list_collections(database):
                copied += _copy(db.get_collection(cid, database), store, database, cid)
    finally:
        db.close()
    return copied


def _copy(old, store: Store, db: str, cid: str) -> int:
    index = old.get_index_info("vector") or {}
    metric = METRICS.get(str(index.get("metric_type", "COSINE")).upper(), "cosine")
    flat = str(index.get("index_type", "HNSW")).upper() in ("FLAT", "BRUTE_FORCE")
    kind = "flat" if flat else "hnsw"
    dim = next(f.dim for f in old.schema.fields if f.name == "vector")
    old.load()
    # Every live row's id (the engine's count() leaves out rows of sealed segments).
    want = len(old.query(None, output_fields=["id"]))
    store.drop(db, cid)  # what a start cut short left half-copied
    collection = store.create(db, cid, int(dim), metric, kind)
    copied = 0
    while copied < want:
        rows = old.query(
            None,
            output_fields=["id", "vector", "metadata"],
            limit=PAGE,
            offset=copied,
            order_by_pk=True,
        )
        if not rows:
            break
        collection.write(
            [r["id"] for r in rows],
            np.asarray([r["vector"] for r in rows], dtype=np.float32),
            [_metadata(r.get("metadata")) for r in rows],
        )
        copied += len(rows)
    if collection.count() != want:
        raise RuntimeError(
            f"copying {db}/{cid} from Milvus Lite: {collection.count()} of {want} rows"
        )
    collection.snapshot()
    log.warning("Copied %d rows of %s/%s from Milvus Lite", copied, db, cid)
    return copied


def _metadata(value) -> dict:
    """A row's JSON field as Milvus Lite gives it back: a dict, or its JSON text."""
    if isinstance(value, bytes | str):
        value = json.loads(value or "{}")
    return value or {}
