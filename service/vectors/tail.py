"""The rows a collection has acknowledged but its index does not hold yet, searched
exactly (by brute force), so a search right after an insert finds the new rows.

Writes append their vectors as the blocks they came in, with labels ``start``,
``start + 1``, ... in order; the indexer (:mod:`.indexer`) takes rows off the front
into the FAISS index. The tail is short when the indexer keeps up, and a search over
it costs one matrix product per block; after a bulk load it can hold many rows until
the index catches up, and searches are slower (exact) meanwhile, never wrong.
"""

from __future__ import annotations

import numpy as np


def scores(queries: np.ndarray, vectors: np.ndarray, metric: str) -> np.ndarray:
    """(queries, vectors) scores: squared distances for l2, else inner products."""
    if metric == "l2":
        return (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None]
    return queries @ vectors.T


def best(scores: np.ndarray, labels: np.ndarray, k: int, metric: str):
    """The ``k`` best of each row of ``scores`` (labels -1 never chosen), best first:
    (scores, labels), each (queries, at most k)."""
    worst = np.inf if metric == "l2" else -np.inf
    scores = np.where(labels < 0, worst, scores)
    key = scores if metric == "l2" else -scores
    if key.shape[1] > k:
        keep = np.argpartition(key, k - 1, axis=1)[:, :k]
        key = np.take_along_axis(key, keep, 1)
        scores, labels = np.take_along_axis(scores, keep, 1), np.take_along_axis(labels, keep, 1)
    order = np.argsort(key, axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1), np.take_along_axis(labels, order, 1)


#: Bytes of vectors (and of their scores) an exact search holds at once: the rows a
#: filter matched are copied and scored in chunks of about this size, not all at once
#: (a filter matching 1,000,000 rows of a flat 1,024-d collection copied 4 GB).
EXACT_CHUNK_BYTES = 32 << 20


def exact_best(queries: np.ndarray, labels: np.ndarray, gather, k: int, metric: str):
    """The best ``k`` of ``labels`` per query, exactly: (scores, labels), best first.
    ``gather(labels)`` gives their vectors; it is called for a chunk at a time."""
    rows = max(1, EXACT_CHUNK_BYTES // (4 * (queries.shape[1] + 3 * len(queries))))
    kept = None
    for start in range(0, len(labels), rows):
        part = labels[start : start + rows]
        found = scores(queries, gather(part), metric)
        chunk = best(found, np.broadcast_to(part, found.shape), k, metric)
        if kept is not None:
            chunk = best(np.hstack([kept[0], chunk[0]]), np.hstack([kept[1], chunk[1]]), k, metric)
        kept = chunk
    if kept is None:
        empty = np.empty((len(queries), 0))
        return empty, empty.astype(np.int64)
    return kept


class Tail:
    def __init__(self, dim: int, start: int = 0):
        self.dim = dim
        self.start = start  # the label of the first row here
        self.rows = 0
        self.blocks: list[np.ndarray] = []

    @property
    def end(self) -> int:
        return self.start + self.rows

    def append(self, vectors: np.ndarray) -> None:
        if len(vectors):
            self.blocks.append(vectors)
            self.rows += len(vectors)

    def front(self, n: int) -> np.ndarray:
        """A contiguous copy of the first ``n`` rows at most (for the index's add)."""
        parts, got = [], 0
        for block in self.blocks:
            if got >= n:
                break
            parts.append(block[: n - got])
            got += len(parts[-1])
        if not parts:
            return np.empty((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

    def drop_front(self, n: int) -> None:
        """The first ``n`` rows are in the index now."""
        self.start += n
        self.rows -= n
        while n:
            block = self.blocks[0]
            if len(block) <= n:
                self.blocks.pop(0)
                n -= len(block)
            else:
                self.blocks[0] = block[n:]
                n = 0

    def vectors(self) -> np.ndarray:
        """Every row's vector, one array (a copy)."""
        return self.front(self.rows)

    def gather(self, labels: np.ndarray) -> np.ndarray:
        """The vectors of ``labels`` (each in ``[start, end)``), in their order."""
        out = np.empty((len(labels), self.dim), dtype=np.float32)
        firsts = self.start + np.cumsum([0] + [len(b) for b in self.blocks])
        which = np.searchsorted(firsts, labels, side="right") - 1
        for b in np.unique(which):
            here = which == b
            out[here] = self.blocks[b][labels[here] - firsts[b]]
        return out

    def search(self, queries: np.ndarray, k: int, metric: str, labels: np.ndarray | None = None):
        """The best ``k`` of these rows (or of ``labels`` among them) per query, exactly:
        (scores, labels), best first."""
        if labels is not None:
            return exact_best(queries, labels, self.gather, k, metric)
        kept_scores, kept_labels = [], []
        first = self.start
        for block in self.blocks:
            found = scores(queries, block, metric)
            mine = np.broadcast_to(np.arange(first, first + len(block)), found.shape)
            s, lab = best(found, mine, k, metric)
            kept_scores.append(s)
            kept_labels.append(lab)
            first += len(block)
        if not kept_scores:
            empty = np.empty((len(queries), 0))
            return empty, empty.astype(np.int64)
        return best(np.hstack(kept_scores), np.hstack(kept_labels), k, metric)
