"""One collection of the embedded engine: a FAISS index, the rows not in it yet (the
tail, :mod:`.tail`), the rows' ids and metadata held beside them, its write-ahead log
and its snapshots.

On disk (``<root>/<database>/<collection>/``)::

    schema.json        dim, metric, index (written once, at create)
    snap-<seq>/        index.faiss, tail.f32 (the rows not indexed then), rows.json
                       (ids, metadata, deleted marks), done
    wal-<seq>          the writes after snapshot <seq>, each fsynced before it is answered

A write is answered once it is in the log (fsynced) and in memory: its rows go to the
tail, searched exactly, so the next search finds them. The engine's indexer
(:mod:`.indexer`, a thread of its own) moves rows from the tail into the HNSW graph in
large batches; a search merges the graph's hits with the tail's. A restart loads the
newest complete snapshot and replays the logs after it into the tail, and the indexer
builds from there: a kill -9 loses no acknowledged row, only indexing work.

Rows are FAISS labels 0, 1, 2, ... in the order written; those below ``tail.start``
are in the index. A delete (or the old row of an upsert) marks its label dead;
searches skip dead labels in both parts (FAISS's ``IDSelector`` in the index, a label
list in the tail), and a snapshot with more dead than live rows rebuilds the index
from the live ones (in the background: they go back to the tail). Cosine is the inner
product of normalised vectors. A filter is evaluated over the metadata first: few
matches are searched exactly, many through the index restricted to them (and the
tail's matches exactly), so a filtered search returns k hits when k rows match.

Locks, always taken in this order: ``builder`` (one change to the index at a time:
the indexer's add, a snapshot), ``_writing`` (writes in log order), ``lock`` (the
rows: ids, metadata, tail; searches share it) and ``index_lock`` (the FAISS index:
searches share it, an add holds it alone).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import threading
import time
from collections.abc import Callable

import faiss
import numpy as np

from . import wal
from .filter_match import Predicate
from .row_cost import metadata_cost, rows_cost
from .rwlock import RWLock
from .tail import Tail, best, exact_best

#: HNSW's graph degree and build breadth; search breadth is max(ef, 2k), ef the
#: service's (c.VectorSettings.collection_search_ef, whose default and reason this
#: is), EF_SEARCH where a call gives none. The build breadth decides whether a search
#: reaches every part of a large collection: on 1,000,000 vectors shaped like text
#: embeddings (benchmarks/vector_search.py: 2,000 far-apart clusters), FAISS built
#: with 64 found 0.80 of the true top 10 at efSearch 128 (0.92 at most, at 1024: the
#: searches that missed found none of a query's cluster); with 128, 0.977 (0.914 at
#: 64) at 2,998 rows/s built on 2 cores; with 200, 0.997 at 1,753 rows/s. 128 keeps
#: the indexer within 2x of its pace at 64. A collection's index keeps the breadth
#: it was built with (it is in its snapshot).
M = 16
EF_CONSTRUCTION = 128
EF_SEARCH = 128
#: A log past this many bytes (or past the last snapshot's size, so that snapshots
#: cost at most as much again as the data) is folded into a snapshot.
SNAPSHOT_BYTES = 256 * 2**20
#: A collection whose writes paused and whose index caught up folds a log this big.
IDLE_SNAPSHOT_BYTES = 32 * 2**20
#: Filters matching at most this many rows are searched exactly over those rows.
EXACT_BELOW = 20_000


def new_index(dim: int, metric: str, kind: str):
    faiss_metric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlat(dim, faiss_metric)
    index = faiss.IndexHNSWFlat(dim, M, faiss_metric)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    return index


class IdsTaken(Exception):
    """An insert of ids the collection holds already (nothing of it was written)."""

    def __init__(self, ids: list[str]):
        super().__init__(f"{len(ids)} of these ids are here already")
        self.ids = ids


class Collection:
    def __init__(self, path: str, dim: int, metric: str, kind: str):
        self.path, self.dim, self.metric, self.kind = path, dim, metric, kind
        self.builder = threading.Lock()
        self._writing = threading.Lock()
        self.lock = RWLock()
        self.index_lock = RWLock()
        self.index = new_index(dim, metric, kind)
        self.tail = Tail(dim)
        self.ids: list[str | None] = []  # by label; None: deleted
        self.metadata: list[dict | None] = []
        self.label_of: dict[str, int] = {}
        self.seq = 0  # of the last write
        self._live: tuple[int, np.ndarray | None] = (-1, None)
        self.log: wal.Log | None = None
        self.closed = False
        #: Writes paused (the service said so): fold the log once the index caught up.
        self.idle = False
        #: The bytes of the last snapshot's vectors: a log this long is folded too.
        self.snapshot_bytes = 0
        #: Whether the last snapshot saved rows that were not indexed yet.
        self.snapshot_tail = False
        #: Called after each write, outside the locks: the indexer's wake-up.
        self.on_write: Callable[[], None] | None = None
        #: When it was last searched (time.monotonic()): the indexer's batches are short then.
        self.searched_at = -float("inf")
        #: What the live rows cost (:mod:`.row_cost`): counted at the first ask, then
        #: kept up to date by each write and delete; None until asked.
        self._bytes: int | None = None

    # -- on disk ---------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, dim: int, metric: str, kind: str) -> Collection:
        tmp = path + ".new"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp, mode=0o700)
        _write_json(os.path.join(tmp, "schema.json"), {"dim": dim, "metric": metric, "index": kind})
        os.rename(tmp, path)
        _fsync_dir(os.path.dirname(path))
        collection = cls(path, dim, metric, kind)
        collection.log = wal.Log(os.path.join(path, "wal-0"))
        return collection

    @classmethod
    def open(cls, path: str) -> Collection:
        with open(os.path.join(path, "schema.json")) as f:
            schema = json.load(f)
        collection = cls(path, schema["dim"], schema["metric"], schema["index"])
        collection._load()
        return collection

    def _load(self) -> None:
        snaps = sorted(
            (
                int(p.rsplit("-", 1)[1])
                for p in glob.glob(os.path.join(self.path, "snap-*"))
                if not p.endswith(".tmp") and os.path.exists(os.path.join(p, "done"))
            ),
        )
        if snaps:
            snap = os.path.join(self.path, f"snap-{snaps[-1]}")
            self.index = faiss.read_index(os.path.join(snap, "index.faiss"))
            with open(os.path.join(snap, "rows.json")) as f:
                rows = json.load(f)
            self.ids, self.metadata = rows["ids"], rows["metadata"]
            self.label_of = {rid: i for i, rid in enumerate(self.ids) if rid is not None}
            self.tail = Tail(self.dim, self.index.ntotal)
            tail_file = os.path.join(snap, "tail.f32")
            if os.path.exists(tail_file):
                self.tail.append(np.fromfile(tail_file, dtype="<f4").reshape(-1, self.dim))
            if self.tail.end != len(self.ids):
                raise RuntimeError(f"{snap}: {self.tail.end} vectors for {len(self.ids)} rows")
            self.seq = snaps[-1]
            self.snapshot_bytes = len(self.ids) * self.dim * 4
            self.snapshot_tail = bool(self.tail.rows)
        logs = sorted(
            glob.glob(os.path.join(self.path, "wal-*")), key=lambda p: int(p.rsplit("-", 1)[1])
        )
        for path in logs:
            for header, vectors in wal.replay(path, self.dim):
                if header["seq"] > self.seq:
                    self._apply(header, vectors)
                    self.seq = header["seq"]
        self.log = wal.Log(logs[-1] if logs else os.path.join(self.path, f"wal-{self.seq}"))

    def snapshot_due(self) -> bool:
        """Whether the log is long enough to fold (checked by the indexer)."""
        size = 0 if self.log is None else self.log.size
        if size > max(SNAPSHOT_BYTES, self.snapshot_bytes):
            return True
        # Writes paused and the index caught up: fold a long log, or take again a
        # snapshot that saved rows not indexed then (a restart would index them once
        # more), even with no write after it (a bulk load's log folded at its last write).
        caught_up = self.idle and not self.tail.rows
        return caught_up and (size > IDLE_SNAPSHOT_BYTES or self.snapshot_tail)

    def snapshot(self) -> None:
        """The index, the tail and the rows as of now into ``snap-<seq>``; writes go to
        a new log from then on, and the older snapshots and logs go. Writes and
        searches wait only while the rows are copied, not while the files are written."""
        with self.builder:
            with self._writing, self.lock.write():
                if self.closed:
                    return
                if os.path.exists(os.path.join(self.path, f"snap-{self.seq}", "done")):
                    # No write since that snapshot (taken again without its tail): the
                    # new one is the next in order, and the next write's after it.
                    self.seq += 1
                seq = self.seq
                final = os.path.join(self.path, f"snap-{seq}")
                if self.kind == "hnsw" and len(self.label_of) * 2 < len(self.ids):
                    self._rebuild()
                rows = {"ids": list(self.ids), "metadata": list(self.metadata)}
                tail_blocks = list(self.tail.blocks)
                old_log = self.log
                self.log = wal.Log(os.path.join(self.path, f"wal-{seq}"))
            old_log.close()
            tmp = final + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp, mode=0o700)
            # Only this thread changes the index now (it holds the builder); searches
            # read it meanwhile, as this does.
            faiss.write_index(self.index, os.path.join(tmp, "index.faiss"))
            with open(os.path.join(tmp, "tail.f32"), "wb") as f:
                for block in tail_blocks:
                    f.write(np.ascontiguousarray(block, "<f4").tobytes())
                f.flush()
                os.fsync(f.fileno())
            _write_json(os.path.join(tmp, "rows.json"), rows)
            _fsync_file(os.path.join(tmp, "index.faiss"))
            _write_json(os.path.join(tmp, "done"), {"seq": seq})
            _fsync_dir(tmp)  # its files' names on disk before it takes the final name
            os.rename(tmp, final)
            _fsync_dir(self.path)
            self.snapshot_bytes = len(rows["ids"]) * self.dim * 4
            self.snapshot_tail = bool(tail_blocks)
        for path in glob.glob(os.path.join(self.path, "snap-*")) + glob.glob(
            os.path.join(self.path, "wal-*")
        ):
            if int(path.rsplit("-", 1)[1].removesuffix(".tmp")) < seq:
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)

    def _rebuild(self) -> None:
        """After many deletes: the live rows only (labels renumbered), all in the tail
        again, so the indexer builds their graph anew in the background. Under the
        builder and the rows' write lock."""
        live = np.asarray([i for i, rid in enumerate(self.ids) if rid is not None], np.int64)
        with self.index_lock.write():
            vectors = self._gather(live)
            self.index = new_index(self.dim, self.metric, self.kind)
        self.tail = Tail(self.dim)
        self.tail.append(vectors)
        self.ids = [self.ids[i] for i in live]
        self.metadata = [self.metadata[i] for i in live]
        self.label_of = {rid: i for i, rid in enumerate(self.ids)}

    def close(self) -> None:
        """No more writes, indexing or snapshots (a drop, a clean stop)."""
        with self.builder, self._writing, self.lock.write():
            self.closed = True
            if self.log is not None:
                self.log.close()
                self.log = None

    # -- the index, built behind the log -----------------------------------------------
    def pending(self) -> int:
        """Rows written but not in the index yet."""
        return self.tail.rows

    def index_some(self, rows: int) -> int:
        """Move up to ``rows`` rows from the tail into the index (the indexer's step);
        how many it moved. Searches wait for the index only during FAISS's add."""
        with self.builder:
            with self.lock.read():
                if self.closed or not self.tail.rows:
                    return 0
                start = self.tail.start
                chunk = self.tail.front(rows)
            with self.index_lock.write():
                self.index.add(chunk)
            # Between here and the tail's move, a search finds these rows in both
            # parts: it takes the index's hits below tail.start only.
            with self.lock.write():
                if self.tail.start == start:
                    self.tail.drop_front(len(chunk))
            return len(chunk)

    def build(self) -> None:
        """Index every pending row now (tests, a migration, a clean stop's caller)."""
        while self.index_some(50_000):
            pass

    # -- rows ------------------------------------------------------------------------
    def write(
        self, ids: list[str], vectors: np.ndarray, metadata: list[dict], new_only: bool = False
    ) -> None:
        """Upsert: a row whose id is here already replaces it; ``new_only`` (an insert):
        :class:`IdsTaken` if any id is here already, and nothing is written. Answered
        once it is in the log, fsynced; searchable at once (the tail), indexed soon after."""
        vectors = self._prepared(vectors)
        cost = rows_cost(self.dim, metadata)  # outside the locks: a pass over the metadata
        with self._writing:
            if self.log is None:
                raise RuntimeError("the collection was closed (dropped meanwhile?)")
            if new_only:  # under _writing: no write of the same ids comes between
                taken = [rid for rid in ids if rid in self.label_of]
                if taken:
                    raise IdsTaken(taken)
            header = {"seq": self.seq + 1, "op": "write", "ids": ids, "metadata": metadata}
            self.log.append(header, vectors)
            with self.lock.write():
                self._apply(header, vectors, cost)
                self.seq = header["seq"]
                self.idle = False
        if self.on_write is not None:
            self.on_write()

    def delete(self, ids: list[str]) -> None:
        with self._writing:
            if self.log is None:
                raise RuntimeError("the collection was closed (dropped meanwhile?)")
            header = {"seq": self.seq + 1, "op": "delete", "ids": ids}
            self.log.append(header, None)
            with self.lock.write():
                self._apply(header, None)
                self.seq = header["seq"]

    def _apply(self, header: dict, vectors: np.ndarray | None, cost: int | None = None) -> None:
        """``cost``: what the written rows cost (:mod:`.row_cost`), counted by the
        caller outside the locks; None: counted here if the collection's cost is kept."""
        ids = header["ids"]
        counted = self._bytes is not None
        for rid in ids:
            label = self.label_of.pop(rid, None)
            if label is not None:
                self.ids[label] = None
                if counted:
                    self._bytes -= self.dim * 4 + metadata_cost(self.metadata[label])
                self.metadata[label] = None
        if header["op"] != "write":
            return
        metadata = header["metadata"]
        if len(set(ids)) != len(ids):  # the last of repeated ids wins, as in Milvus
            last = {rid: i for i, rid in enumerate(ids)}
            keep = sorted(last.values())
            ids = [ids[i] for i in keep]
            vectors = vectors[keep]
            metadata = [metadata[i] for i in keep]
            cost = None
        if counted:
            self._bytes += cost if cost is not None else rows_cost(self.dim, metadata)
        start = len(self.ids)
        self.tail.append(vectors)
        self.ids.extend(ids)
        self.metadata.extend(metadata)
        self.label_of.update((rid, start + i) for i, rid in enumerate(ids))

    def _prepared(self, vectors) -> np.ndarray:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if self.metric == "cosine":
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def existing(self, ids: list[str]) -> list[str]:
        with self.lock.read():
            return [rid for rid in ids if rid in self.label_of]

    def count(self) -> int:
        return len(self.label_of)

    def held_bytes(self) -> int:
        """What the live rows cost (:mod:`.row_cost`): one pass over them at the first
        ask (its writes wait meanwhile), kept up to date from then on."""
        with self.lock.read():
            if self._bytes is None:
                self._bytes = len(self.label_of) * self.dim * 4 + sum(
                    metadata_cost(m) for m in self.metadata if m is not None
                )
            return self._bytes

    def _indexed_vectors(self) -> np.ndarray:
        """The index's vectors: a view of its own storage, no copy (valid while the
        index is not added to: under ``index_lock``)."""
        storage = self.index.storage if self.kind == "hnsw" else self.index
        codes = faiss.downcast_index(storage).codes
        if codes.size() == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        raw = faiss.rev_swig_ptr(codes.data(), codes.size())
        return raw.view(np.float32).reshape(-1, self.dim)

    def _gather(self, labels: np.ndarray) -> np.ndarray:
        """The vectors of ``labels``, from the index or the tail (under both locks)."""
        out = np.empty((len(labels), self.dim), dtype=np.float32)
        indexed = labels < self.tail.start
        if indexed.any():
            out[indexed] = self._indexed_vectors()[labels[indexed]]
        if not indexed.all():
            out[~indexed] = self.tail.gather(labels[~indexed])
        return out

    def rows(self):
        """(id, vector, metadata) of every live row, for a copy elsewhere."""
        with self.lock.read(), self.index_lock.read():
            live = np.asarray([i for i, rid in enumerate(self.ids) if rid is not None], np.int64)
            vectors = self._gather(live)
            return [
                (self.ids[label], vectors[n], self.metadata[label])
                for n, label in enumerate(live.tolist())
            ]

    # -- search ----------------------------------------------------------------------
    def search(
        self, queries, k: int, match: Predicate | None = None, ef: int = EF_SEARCH
    ) -> list[list[tuple]]:
        """(id, score, metadata) of the best ``k`` rows per query; ``match``: only rows
        it takes. Cosine and IP scores are similarities, L2 a squared distance."""
        queries = self._prepared(queries)
        self.searched_at = time.monotonic()
        with self.lock.read(), self.index_lock.read():
            if not self.label_of:
                return [[] for _ in queries]
            labels = self._wanted(match)
            if labels is not None and len(labels) == 0:
                return [[] for _ in queries]
            if labels is not None and (len(labels) <= EXACT_BELOW or self.kind == "flat"):
                scored, found = exact_best(queries, labels, self._gather, k, self.metric)
            else:
                scored, found = self._both(queries, labels, k, ef)
            return [
                [
                    (self.ids[label], float(score), self.metadata[label])
                    for score, label in zip(row_scores, row_labels, strict=True)
                    if label >= 0
                ]
                for row_scores, row_labels in zip(scored, found, strict=True)
            ]

    def _wanted(self, match: Predicate | None) -> np.ndarray | None:
        """The labels a search may return (sorted), or None for every label."""
        if match is not None:
            return np.fromiter(
                (
                    i
                    for i, rid in enumerate(self.ids)
                    if rid is not None and match(rid, self.metadata[i])
                ),
                dtype=np.int64,
            )
        if len(self.label_of) < len(self.ids):  # rows deleted: the live ones, kept till a write
            if self._live[0] != self.seq:
                live = np.fromiter(self.label_of.values(), dtype=np.int64)
                self._live = (self.seq, np.sort(live))
            return self._live[1]
        return None

    def _both(self, queries, labels, k: int, ef: int = EF_SEARCH):
        """The index's hits and the tail's (exact), merged: the best ``k`` of both."""
        start = self.tail.start
        parts = []
        if start:
            mine = None if labels is None else labels[labels < start]
            if mine is None or len(mine):
                parts.append(self._indexed(queries, mine, k, start, ef))
        if self.tail.rows:
            mine = None if labels is None else labels[labels >= start]
            if mine is None or len(mine):
                parts.append(self.tail.search(queries, k, self.metric, mine))
        if not parts:
            return np.empty((len(queries), 0)), np.empty((len(queries), 0), np.int64)
        if len(parts) == 1:
            return parts[0]
        return best(
            np.hstack([p[0] for p in parts]), np.hstack([p[1] for p in parts]), k, self.metric
        )

    def _indexed(self, queries, labels, k: int, start: int, ef: int = EF_SEARCH):
        """The index's best ``k`` among labels below ``start`` (or ``labels``)."""
        params = None
        selector = None
        if labels is not None:
            bitmap = np.zeros((start + 7) // 8, dtype=np.uint8)
            np.bitwise_or.at(bitmap, labels >> 3, (1 << (labels & 7)).astype(np.uint8))
            selector = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
        if self.kind == "hnsw":
            params = faiss.SearchParametersHNSW()
            params.efSearch = max(ef, 2 * k)
            if selector is not None:
                params.sel = selector
        elif selector is not None:
            params = faiss.SearchParameters()
            params.sel = selector
        found_scores, found = self.index.search(queries, min(k, start), params=params)
        found = np.where(found >= start, -1, found)  # in the tail still: found there
        return found_scores, found


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    _fsync_file(path)
