"""The embedded engine's collections: ``<root>/<database>/<collection>/`` each
(:mod:`.faiss_collection`), opened at their first use and kept open.

The database is the owner's (``database_of``, named by the service) and the
collection's name the id of its row in the service's database, so names here are
the service's, never a user's; they are still checked to be plain names. One indexer
(:mod:`.indexer`) builds every open collection's index behind its log.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading

from .faiss_collection import Collection
from .indexer import Indexer

log = logging.getLogger("gpulab.service.vectors")

NAME = re.compile(r"[A-Za-z0-9_]{1,64}")  # fullmatch: "$" lets "x\n" by


class NotFound(Exception):
    pass


class Store:
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)
        self._open: dict[tuple[str, str], Collection] = {}
        self._lock = threading.Lock()
        #: One opening at a time per collection (its log replays once).
        self._opening: dict[tuple[str, str], threading.Lock] = {}
        self.indexer = Indexer(self.opened)

    def opened(self) -> list[Collection]:
        with self._lock:
            return list(self._open.values())

    def _watched(self, collection: Collection) -> Collection:
        """The indexer builds its index from now on (a reopened one: what its log replayed)."""
        collection.on_write = self.indexer.wake
        self.indexer.wake()
        return collection

    def path(self, db: str, cid: str) -> str:
        if not NAME.fullmatch(db) or not NAME.fullmatch(cid):
            raise ValueError(f"not a plain name: {db!r}/{cid!r}")
        return os.path.join(self.root, db, cid)

    def names(self) -> list[tuple[str, str]]:
        out = []
        for db in sorted(os.listdir(self.root)):
            if NAME.fullmatch(db) and os.path.isdir(os.path.join(self.root, db)):
                out += [
                    (db, cid)
                    for cid in sorted(os.listdir(os.path.join(self.root, db)))
                    if NAME.fullmatch(cid)
                ]
        return out

    def get(self, db: str, cid: str) -> Collection:
        key = (db, cid)
        with self._lock:
            if key in self._open:
                return self._open[key]
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            with self._lock:
                if key in self._open:
                    return self._open[key]
            path = self.path(db, cid)
            if not os.path.exists(os.path.join(path, "schema.json")):
                raise NotFound(f"collection {cid} does not exist")
            collection = Collection.open(path)
            with self._lock:
                self._open[key] = collection
            return self._watched(collection)

    def create(self, db: str, cid: str, dim: int, metric: str, index: str) -> Collection:
        path = self.path(db, cid)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with self._lock:
            if (db, cid) in self._open or os.path.exists(path):
                raise FileExistsError(f"collection {cid} exists already")
            collection = Collection.create(path, dim, metric, index)
            self._open[(db, cid)] = collection
        return self._watched(collection)

    def drop(self, db: str, cid: str) -> None:
        path, key = self.path(db, cid), (db, cid)
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        # A drop is not queued behind its owner's calls: one of theirs that opens the
        # collection meanwhile waits here, then finds it gone (never a dropped
        # collection opened again, left in _open over a removed folder).
        with opening:
            with self._lock:
                collection = self._open.pop(key, None)
            if collection is not None:
                collection.close()
            if not os.path.exists(path):
                return
            trash = path + ".dropped"
            os.rename(path, trash)  # gone at once, even if the removal below is cut short
        shutil.rmtree(trash, ignore_errors=True)

    def close(self) -> None:
        """At a clean stop: the indexer stops, and what the logs hold goes into
        snapshots (the rows not indexed yet as the tail), so the next start replays nothing."""
        self.indexer.stop()
        with self._lock:
            opened = list(self._open.values())
            self._open.clear()
        for collection in opened:
            try:
                if collection.log is not None and collection.log.size:
                    collection.snapshot()
            except OSError as e:  # one collection's disk error: the others still saved
                log.warning("Could not snapshot collection %s: %s", collection.path, e)
            collection.close()
