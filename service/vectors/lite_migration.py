"""The collections an older gpulab kept in Milvus Lite, copied into the FAISS engine at
its first start, without losing a row.

The old engine's data is ``DATA_DIR`` itself (``databases/u_<owner hash>/collections/
c<id>/``). It is opened with Milvus Lite (in this process, for the time of the copy)
and every row (id, vector, metadata) of every collection is read in pages, in id
order, each page the rows after the last one copied (``id > last``: a page by offset
made Milvus Lite read every row before it again, so a copy took the square of its
rows' time, and 300,000 rows passed the engine's start limit and began again each
time), and written into a new collection of the same name (the service's row id)
and database (the owner's).

Progress is kept (``PROGRESS`` in the new folder: the last id copied of each
collection, and those done) after each page, so a start cut short goes on where it
stopped, and a collection copied already (its rows counted) is not copied again. The
file's changes also tell the service that the copy goes on (its start limit counts
from the last page, :mod:`.engine_process`). A collection counts as copied only once
it holds as many rows as the old one. The old files are left where they are (a
downgrade still finds them) and ``MIGRATED`` in the new folder says the copy is done.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import numpy as np

from .embedded_store import Store

log = logging.getLogger("gpulab.service.vectors.engine")

MARKER = "MIGRATED"
#: In the new folder while a copy goes on: {"db/cid": {"last": id, "copied": n}, ...}
#: and "done": the collections copied whole. Written after each page.
PROGRESS = "lite-migration.json"
#: Values (rows times their dimension) read in one page, and the rows a page holds at
#: least and at most: each page costs Milvus Lite a pass over every row of the
#: collection, so pages are large (20,000 rows of 384-d vectors), within memory.
PAGE_VALUES = 8_000_000
PAGE_MIN, PAGE_MAX = 2000, 50_000
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
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(store.root, PROGRESS))
    return copied


def migrate_from(data_dir: str, store: Store) -> int:
    from milvus_lite.db import MilvusLite

    db = MilvusLite(data_dir)
    progress = Progress(os.path.join(store.root, PROGRESS))
    copied = 0
    try:
        for database in db.list_databases():
            if not database.startswith("u_"):
                continue  # not a database the service made
            for cid in db.list_collections(database):
                old = db.get_collection(cid, database)
                copied += _copy(old, store, database, cid, progress)
    finally:
        db.close()
    return copied


class Progress:
    """What was copied so far, on disk (replaced whole, fsynced, after each page)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path) as f:
                self.state = json.load(f)
        except (OSError, ValueError):
            self.state = {}
        self.state.setdefault("done", [])
        self.state.setdefault("collections", {})

    def done(self, key: str) -> bool:
        return key in self.state["done"]

    def last(self, key: str) -> str | None:
        return self.state["collections"].get(key, {}).get("last")

    def page(self, key: str, last: str, copied: int) -> None:
        self.state["collections"][key] = {"last": last, "copied": copied}
        self._save()

    def finished(self, key: str) -> None:
        self.state["collections"].pop(key, None)
        if key not in self.state["done"]:
            self.state["done"].append(key)
        self._save()

    def forget(self, key: str) -> None:
        self.state["collections"].pop(key, None)
        if key in self.state["done"]:
            self.state["done"].remove(key)
        self._save()

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _copy(old, store: Store, db: str, cid: str, progress: Progress) -> int:
    key = f"{db}/{cid}"
    index = old.get_index_info("vector") or {}
    metric = METRICS.get(str(index.get("metric_type", "COSINE")).upper(), "cosine")
    flat = str(index.get("index_type", "HNSW")).upper() in ("FLAT", "BRUTE_FORCE")
    kind = "flat" if flat else "hnsw"
    dim = int(next(f.dim for f in old.schema.fields if f.name == "vector"))
    old.load()
    # Every live row's id (the engine's count() leaves out rows of sealed segments).
    want = len(old.query(None, output_fields=["id"]))
    collection = _copied_so_far(store, db, cid)
    if collection is not None and collection.count() == want:
        if not progress.done(key):
            progress.finished(key)
        return 0  # copied whole by an earlier start
    last = progress.last(key) if collection is not None else None
    if last is None:  # nothing of it kept, or kept with no record of how far: anew
        progress.forget(key)
        store.drop(db, cid)
        collection = store.create(db, cid, dim, metric, kind)
    page = max(PAGE_MIN, min(PAGE_MAX, PAGE_VALUES // max(dim, 1)))
    copied = collection.count()
    while True:
        rows = old.query(
            None if last is None else f"id > {_literal(last)}",
            output_fields=["id", "vector", "metadata"],
            limit=page,
            order_by_pk=True,
        )
        if not rows:
            break
        # An upsert: a page written before a crash cut off its progress is written
        # again, not twice.
        collection.write(
            [r["id"] for r in rows],
            np.asarray([r["vector"] for r in rows], dtype=np.float32),
            [_metadata(r.get("metadata")) for r in rows],
        )
        last = rows[-1]["id"]
        copied = collection.count()
        progress.page(key, last, copied)
    if collection.count() != want:
        progress.forget(key)  # the next start copies it anew
        raise RuntimeError(
            f"copying {db}/{cid} from Milvus Lite: {collection.count()} of {want} rows"
        )
    collection.snapshot()
    progress.finished(key)
    log.warning("Copied %d rows of %s/%s from Milvus Lite", copied, db, cid)
    return copied


def _copied_so_far(store: Store, db: str, cid: str):
    """The new engine's collection of that name, as an earlier start left it, or None."""
    if not os.path.exists(os.path.join(store.path(db, cid), "schema.json")):
        return None
    return store.get(db, cid)


def _literal(text: str) -> str:
    """``text`` as a string of Milvus Lite's filters: escapes for ``\\``, ``"`` and
    line breaks only (it knows no ``\\u``); every other character as it is."""
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def _metadata(value) -> dict:
    """A row's JSON field as Milvus Lite gives it back: a dict, or its JSON text."""
    if isinstance(value, bytes | str):
        value = json.loads(value or "{}")
    return value or {}
