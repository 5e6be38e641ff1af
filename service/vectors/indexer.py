"""The embedded engine's indexer: one thread of its own that moves every collection's
acknowledged rows from its tail (searched exactly) into its FAISS index, in large
batches, and folds long logs into snapshots.

Writes are answered once they are in the log, so they run at the speed of the disk,
not of HNSW's construction; this thread catches up behind them (a round over the
collections, one batch each, so a big load into one does not hold back another's).
A batch is sized to take about ``BATCH_S`` seconds at the rate the last one ran, and
searches of that collection wait for FAISS's add: a collection searched in the last
``SEARCHED_S`` seconds gets short batches (``SHORT_BATCH_S``), one being loaded with
no one searching it long ones (HNSW adds larger batches more efficiently). It is a thread of its
own, never a worker of a pool that answers calls, and FAISS's add runs its OpenMP
threads from it; they run ``NICE`` steps nicer than the engine's calls, so a write or
a search that wants a core gets it before the graph's construction does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from .faiss_collection import Collection

log = logging.getLogger("gpulab.service.vectors.engine")

#: Seconds one batch should take, and rows per batch at least and at most.
BATCH_S, BATCH_ROWS = 2.0, (1_000, 50_000)
#: The same for a collection searched in the last SEARCHED_S seconds (its searches
#: wait for the batch).
SHORT_BATCH_S, SHORT_BATCH_ROWS = 0.1, (50, 50_000)
SEARCHED_S = 10.0
#: After a failure (logged), the next try waits this long.
RETRY_S = 5.0
#: How much nicer than the engine's calls the indexer's threads run.
NICE = 5


class Indexer:
    def __init__(self, collections: Callable[[], list[Collection]]):
        #: The open collections, each round (the store's).
        self.collections = collections
        self._wake = threading.Event()
        self._stopping = False
        self._rate: dict[int, float] = {}  # rows/s of a collection's last batch, by id()
        self._thread = threading.Thread(
            target=self._run, name="gpulab-vectors-indexer", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Stop after the batch in hand (a clean stop snapshots what is left)."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        # Linux keeps a nice value per thread, and the OpenMP threads FAISS starts from
        # this one inherit it.
        me = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + NICE))
        except OSError as e:
            log.warning("the indexer runs at the engine's priority: %s", e)
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            while not self._stopping and self._round():
                pass

    def _round(self) -> bool:
        """One batch of each collection with rows waiting, and the snapshots due;
        whether there is more to do."""
        more = False
        for collection in self.collections():
            if self._stopping:
                return False
            try:
                if collection.pending():
                    self._batch(collection)
                    more = more or bool(collection.pending())
                if collection.snapshot_due():
                    collection.snapshot()
            except Exception:
                log.exception("indexing %s failed; trying again in %g s", collection.path, RETRY_S)
                time.sleep(RETRY_S)
                more = True
        return more

    def _batch(self, collection: Collection) -> None:
        rate = self._rate.get(id(collection), 0.0)
        searched = time.monotonic() - collection.searched_at < SEARCHED_S
        seconds, (least, most) = (
            (SHORT_BATCH_S, SHORT_BATCH_ROWS) if searched else (BATCH_S, BATCH_ROWS)
        )
        rows = int(min(max(rate * seconds, least), most))
        start = time.perf_counter()
        done = collection.index_some(rows)
        elapsed = time.perf_counter() - start
        if done and elapsed > 0:
            self._rate[id(collection)] = done / elapsed
