"""One collection of the embedded engine: a FAISS index, the rows' ids and metadata held
beside it, its write-ahead log and its snapshots.

On disk (``<root>/<database>/<collection>/``)::

    schema.json        dim, metric, index (written once, at create)
    snap-<seq>/        index.faiss, rows.json (ids, metadata, deleted marks), done
    wal-<seq>          the writes after snapshot <seq>, each fsynced before it is answered

A write goes to the log, then to the index; a restart loads the newest complete
snapshot and replays the logs after it. A snapshot is taken when the log passed
``SNAPSHOT_BYTES`` (and at a clean stop); then older snapshots and logs go.

Rows are FAISS labels 0, 1, 2, ... in the order written. A delete (or the old row of an
upsert) marks its label dead; searches skip dead labels (FAISS's ``IDSelector``), and
a snapshot with more dead than live rows rebuilds the index from the live ones.
Cosine is the inner product of normalised vectors. A filter is evaluated over the
metadata first: few matches are searched exactly, many through the index restricted
to them, so a filtered search returns k hits when k rows match.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import threading

import faiss
import numpy as np

from . import wal
from .filter_match import Predicate

#: HNSW's graph degree and build breadth; search breadth is max(EF_SEARCH, 2k).
M = 16
EF_CONSTRUCTION = 64
EF_SEARCH = 64
#: A log past this many bytes is folded into a snapshot.
SNAPSHOT_BYTES = 256 * 2**20
#: Filters matching at most this many rows are searched exactly over those rows.
EXACT_BELOW = 20_000


class RWLock:
    """Many searches at once, or one write."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    def read(self):
        return _Held(self, False)

    def write(self):
        return _Held(self, True)

    def _acquire(self, write: bool) -> None:
        with self._cond:
            if write:
                while self._writing or self._readers:
                    self._cond.wait()
                self._writing = True
            else:
                while self._writing:
                    self._cond.wait()
                self._readers += 1

    def _release(self, write: bool) -> None:
        with self._cond:
            if write:
                self._writing = False
            else:
                self._readers -= 1
            self._cond.notify_all()


class _Held:
    def __init__(self, lock: RWLock, write: bool):
        self.lock, self.write = lock, write

    def __enter__(self):
        self.lock._acquire(self.write)

    def __exit__(self, *exc):
        self.lock._release(self.write)


def new_index(dim: int, metric: str, kind: str):
    faiss_metric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlat(dim, faiss_metric)
    index = faiss.IndexHNSWFlat(dim, M, faiss_metric)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    return index


class Collection:
    def __init__(self, path: str, dim: int, metric: str, kind: str):
        self.path, self.dim, self.metric, self.kind = path, dim, metric, kind
        self.lock = RWLock()
        self.index = new_index(dim, metric, kind)
        self.ids: list[str | None] = []  # by label; None: deleted
        self.metadata: list[dict | None] = []
        self.label_of: dict[str, int] = {}
        self.seq = 0  # of the last write
        self._live: tuple[int, np.ndarray | None] = (-1, None)
        self.log: wal.Log | None = None

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
            self.seq = snaps[-1]
        logs = sorted(
            glob.glob(os.path.join(self.path, "wal-*")), key=lambda p: int(p.rsplit("-", 1)[1])
        )
        for path in logs:
            for header, vectors in wal.replay(path, self.dim):
                if header["seq"] > self.seq:
                    self._apply(header, vectors)
                    self.seq = header["seq"]
        self.log = wal.Log(logs[-1] if logs else os.path.join(self.path, f"wal-{self.seq}"))

    def snapshot(self) -> None:
        """The index and rows as of now into ``snap-<seq>``; then a new log, and the
        older snapshots and logs go. Searches and writes wait meanwhile (rare: once per
        ``SNAPSHOT_BYTES`` of writes, and at a clean stop)."""
        with self.lock.write():
            seq = self.seq
            final = os.path.join(self.path, f"snap-{seq}")
            if os.path.exists(os.path.join(final, "done")):
                return
            tmp = final + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp, mode=0o700)
            if self.kind == "hnsw" and len(self.label_of) * 2 < len(self.ids):
                self._rebuild()
            faiss.write_index(self.index, os.path.join(tmp, "index.faiss"))
            _write_json(
                os.path.join(tmp, "rows.json"), {"ids": self.ids, "metadata": self.metadata}
            )
            _write_json(os.path.join(tmp, "done"), {"seq": seq})
            os.rename(tmp, final)
            old_log = self.log
            self.log = wal.Log(os.path.join(self.path, f"wal-{seq}"))
            old_log.close()
            _fsync_dir(self.path)
        for path in glob.glob(os.path.join(self.path, "snap-*")) + glob.glob(
            os.path.join(self.path, "wal-*")
        ):
            if int(path.rsplit("-", 1)[1].removesuffix(".tmp")) < seq:
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)

    def _rebuild(self) -> None:
        """The index of the live rows only (labels renumbered): after many deletes."""
        live = [i for i, rid in enumerate(self.ids) if rid is not None]
        vectors = self.vectors()[live] if live else np.empty((0, self.dim), "f4")
        self.index = new_index(self.dim, self.metric, self.kind)
        if len(vectors):
            self.index.add(vectors)
        self.ids = [self.ids[i] for i in live]
        self.metadata = [self.metadata[i] for i in live]
        self.label_of = {rid: i for i, rid in enumerate(self.ids)}

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    # -- rows ------------------------------------------------------------------------
    def write(self, ids: list[str], vectors: np.ndarray, metadata: list[dict]) -> None:
        """Upsert: a row whose id is here already replaces it."""
        vectors = self._prepared(vectors)
        with self.lock.write():
            header = {"seq": self.seq + 1, "op": "write", "ids": ids, "metadata": metadata}
            self.log.append(header, vectors)
            self._apply(header, vectors)
            self.seq += 1
        if self.log.size > SNAPSHOT_BYTES:
            self.snapshot()

    def delete(self, ids: list[str]) -> None:
        with self.lock.write():
            header = {"seq": self.seq + 1, "op": "delete", "ids": ids}
            self.log.append(header, None)
            self._apply(header, None)
            self.seq += 1

    def _apply(self, header: dict, vectors: np.ndarray | None) -> None:
        ids = header["ids"]
        for rid in ids:
            label = self.label_of.pop(rid, None)
            if label is not None:
                self.ids[label] = None
                self.metadata[label] = None
        if header["op"] != "write":
            return
        if len(set(ids)) != len(ids):  # the last of repeated ids wins, as in Milvus
            last = {rid: i for i, rid in enumerate(ids)}
            keep = sorted(last.values())
            ids = [ids[i] for i in keep]
            vectors = vectors[keep]
            header = {**header, "metadata": [header["metadata"][i] for i in keep]}
        start = len(self.ids)
        self.index.add(vectors)
        self.ids.extend(ids)
        self.metadata.extend(header["metadata"])
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

    def vectors(self) -> np.ndarray:
        """Every label's vector: a view of the index's own storage, no copy (valid while
        the index is not written to: under the collection's lock)."""
        storage = self.index.storage if self.kind == "hnsw" else self.index
        codes = faiss.downcast_index(storage).codes
        if codes.size() == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        raw = faiss.rev_swig_ptr(codes.data(), codes.size())
        return raw.view(np.float32).reshape(-1, self.dim)

    def rows(self):
        """(id, vector, metadata) of every live row, for a copy elsewhere."""
        with self.lock.read():
            vectors = self.vectors()
            for label, rid in enumerate(self.ids):
                if rid is not None:
                    yield rid, vectors[label], self.metadata[label]

    # -- search ----------------------------------------------------------------------
    def search(self, queries, k: int, match: Predicate | None = None) -> list[list[tuple]]:
        """(id, score, metadata) of the best ``k`` rows per query; ``match``: only rows
        it takes. Cosine and IP scores are similarities, L2 a squared distance."""
        queries = self._prepared(queries)
        with self.lock.read():
            n = len(self.ids)
            if not self.label_of:
                return [[] for _ in queries]
            if match is not None:
                labels = np.fromiter(
                    (
                        i
                        for i, rid in enumerate(self.ids)
                        if rid is not None and match(rid, self.metadata[i])
                    ),
                    dtype=np.int64,
                )
            elif len(self.label_of) < n:  # rows deleted: the live ones, kept till a write
                if self._live[0] != self.seq:
                    live = np.fromiter(self.label_of.values(), dtype=np.int64)
                    self._live = (self.seq, np.sort(live))
                labels = self._live[1]
            else:
                labels = None
            if labels is not None and len(labels) == 0:
                return [[] for _ in queries]
            if labels is not None and (len(labels) <= EXACT_BELOW or self.kind == "flat"):
                scores, found = self._exact(queries, labels, k)
            else:
                scores, found = self._indexed(queries, labels, k, n)
            return [
                [
                    (self.ids[label], float(score), self.metadata[label])
                    for score, label in zip(row_scores, row_labels, strict=True)
                    if label >= 0
                ]
                for row_scores, row_labels in zip(scores, found, strict=True)
            ]

    def _indexed(self, queries, labels, k: int, n: int):
        params = None
        selector = None
        if labels is not None:
            bitmap = np.zeros((n + 7) // 8, dtype=np.uint8)
            np.bitwise_or.at(bitmap, labels >> 3, (1 << (labels & 7)).astype(np.uint8))
            selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
        if self.kind == "hnsw":
            params = faiss.SearchParametersHNSW()
            params.efSearch = max(EF_SEARCH, 2 * k)
            if selector is not None:
                params.sel = selector
        elif selector is not None:
            params = faiss.SearchParameters()
            params.sel = selector
        scores, found = self.index.search(queries, min(k, n), params=params)
        return scores, found

    def _exact(self, queries, labels, k: int):
        vectors = self.vectors()[labels]
        if self.metric == "l2":
            scores = (
                (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None]
            )
            order = np.argsort(scores, axis=1)[:, :k]
        else:
            scores = queries @ vectors.T
            order = np.argsort(-scores, axis=1)[:, :k]
        return np.take_along_axis(scores, order, 1), labels[order]


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
