"""The service's client of its embedded engine (:mod:`.engine_server`: FAISS behind
gpulab's write-ahead log, in a process of its own on a Unix socket).

The same calls as :class:`.engine.VectorEngine` (the client of a Milvus cluster), so
the manager does not know which it holds. Calls go on the event loop over a few kept
connections (:mod:`.engine_transport`), through work queues of the users who make
them (:mod:`.owner_queues`, keyed by the caller, whosever collection it is): one
caller holds at most ``PER_OWNER`` of the ``THREADS`` calls in flight, so bob's
expensive searches, in his collections or in one shared with him, leave alice's a
free slot. Errors: the engine's 400/404 as they come, an insert of ids held already
:class:`.engine.IdsTaken` (409), the engine down or restarting 503, a call past
``call_timeout`` (its queue wait included) 504.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from . import engine_protocol as protocol
from . import filters
from .engine import ABANDONED_HINTS, EngineError, IdsTaken, database_of
from .engine_transport import Client, EngineGone
from .owner_queues import OwnerQueues
from .search_batches import SearchBatches

log = logging.getLogger("gpulab.service.vectors")

THREADS = 8
#: Calls in flight for one caller at most: the rest of the slots stay free for others.
PER_OWNER = THREADS // 2
#: A reply larger than this is read in a thread, not on the service's event loop.
UNPACK_ON_LOOP = 1 << 20


class EmbeddedEngine:
    #: A filter as the engine reads it: the grammar's own form, which it parses again.
    filter_text = staticmethod(filters.to_text)

    def __init__(self, uri: str, call_timeout: float = 30.0, search_ef: int | None = None):
        self.uri = uri
        self.call_timeout = call_timeout
        #: HNSW's search breadth (c.VectorSettings.collection_search_ef); None: the engine's.
        self.search_ef = search_ef
        self.queues = OwnerQueues(THREADS, PER_OWNER)
        self.client = Client(uri.removeprefix("unix:"))
        #: Searches of one collection that arrive while one is under way go together.
        self.batches = SearchBatches(self._search)

    async def _call(
        self,
        method: str,
        owner: str | None,
        header: dict,
        vectors: np.ndarray | None = None,
        what: str = "call",
        limited: bool = True,
        caller: str | None = None,
    ) -> dict:
        """A call on ``owner``'s collections, in turn in the work queue of ``caller``
        (the user who asked; None: the owner's); ``owner`` None: the service's own (a
        drop, the start's look for leftovers; ``header`` names the database), sent at
        once."""
        if owner is not None:
            header = {"db": database_of(owner), **header}
        if vectors is not None:
            header["dim"] = vectors.shape[1]
        deadline = time.monotonic() + self.call_timeout

        def call():
            if limited:  # the time left when the owner's turn comes: the engine stops then
                header["time_limit_s"] = max(0.0, deadline - time.monotonic())
            return self.client.call(method, protocol.pack(header, vectors))

        try:
            sent = call() if owner is None else self.queues.run(caller or owner, call)
            if limited:
                reply = await asyncio.wait_for(sent, self.call_timeout)
            else:
                reply = await sent
        except TimeoutError:
            raise self._abandoned(what) from None
        except EngineGone:
            raise EngineError(
                503, "the vector engine is not answering (restarting?); try again"
            ) from None
        if len(reply) > UNPACK_ON_LOOP:  # a search's many hits (at most MAX_SEARCH_REPLY)
            answer, _ = await asyncio.to_thread(protocol.unpack, reply)
        else:
            answer, _ = protocol.unpack(reply)
        if "error" in answer:
            if answer.get("status") == 409 and "taken" in answer:
                raise IdsTaken(answer["taken"], answer.get("n", len(answer["taken"])))
            message = " ".join(str(answer["error"]).split())
            if answer.get("status") == 500:
                log.warning("Vector engine call %s failed: %s", method, message)
                message = f"the vector engine failed: {message}"
            raise EngineError(answer.get("status", 500), message)
        return answer

    def _abandoned(self, what: str) -> EngineError:
        hint = ABANDONED_HINTS.get(what, "try again")
        return EngineError(
            504,
            f"the vector engine did not finish this {what} within {self.call_timeout:g} s "
            f"(c.VectorSettings.vector_call_timeout), so it was abandoned: {hint}",
        )

    async def ping(self, timeout: float) -> bool:
        """Whether the engine answers a call (not only its socket) within ``timeout``;
        outside the owners' queues, which a stuck engine fills."""
        try:
            await asyncio.wait_for(self.client.call("ping", protocol.pack({})), timeout)
        except (TimeoutError, EngineGone):
            return False
        return True

    def close(self) -> None:
        self.client.close()

    # -- collections -------------------------------------------------------------------
    async def create(self, owner: str, cid: str, dim: int, metric: str, index: str) -> None:
        body = {"cid": cid, "dim": dim, "metric": metric, "index": index}
        await self._call("create", owner, body)

    async def drop(self, owner: str, cid: str) -> None:
        """Not behind the owner's searches: queued, it could wait out its time limit
        unsent, and the collection's files stayed, its row gone. Sent, the engine
        finishes it even if its answer comes too late."""
        await self._call("drop", None, {"db": database_of(owner), "cid": cid})

    async def held(self) -> list[tuple[str, str]]:
        """(database, collection) of every collection the engine holds."""
        answer = await self._call("names", None, {})
        return [(db, cid) for db, cid in answer["collections"]]

    async def write(
        self,
        owner: str,
        cid: str,
        rows: list[dict],
        upsert: bool,
        caller: str | None = None,
        new_ids: bool = False,
    ) -> None:
        """Insert or upsert ``rows`` ({id, vector, metadata}): an upsert replaces a row
        whose id is there already; an insert of such an id raises :class:`IdsTaken` and
        writes nothing (the engine looks under its write lock: two inserts of one id at
        once, one wins). Done when the engine's log holds them, fsynced; searchable
        from then on, indexed in the background."""
        vectors = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        body = {
            "cid": cid,
            "ids": [r["id"] for r in rows],
            "metadata": [r["metadata"] for r in rows],
            "insert": not upsert,
        }
        await self._call("write", owner, body, vectors, what="write", caller=caller)

    async def existing(
        self, owner: str, cid: str, ids: list[str], caller: str | None = None
    ) -> set[str]:
        answer = await self._call("existing", owner, {"cid": cid, "ids": ids}, caller=caller)
        return set(answer["ids"])

    async def delete(self, owner: str, cid: str, ids: list[str], caller: str | None = None) -> None:
        await self._call("delete", owner, {"cid": cid, "ids": ids}, what="write", caller=caller)

    async def count(self, owner: str, cid: str, caller: str | None = None) -> int:
        return (await self._call("count", owner, {"cid": cid}, caller=caller))["count"]

    async def usage(self, owner: str, cid: str, caller: str | None = None) -> tuple[int, int]:
        """(rows, bytes): what the collection holds and what that costs the engine's
        memory (:mod:`.row_cost`), for one owner's budget."""
        answer = await self._call("count", owner, {"cid": cid, "bytes": True}, caller=caller)
        return answer["count"], answer["bytes"]

    async def stats(self, owner: str, cid: str, caller: str | None = None) -> dict:
        """The rows, and how many of them wait for the index (searched exactly meanwhile)."""
        answer = await self._call("count", owner, {"cid": cid}, caller=caller)
        return {"count": answer["count"], "pending_index_rows": answer["pending_index_rows"]}

    async def flush(self, owner: str, cid: str) -> None:
        """Writes paused: the engine folds a long log into a snapshot once its index
        caught up (no one waits)."""
        await self._call("flush", owner, {"cid": cid}, limited=False)

    async def search(
        self,
        owner: str,
        cid: str,
        vectors: list[list[float]],
        k: int,
        metric: str,
        filter: str,
        caller: str | None = None,
    ) -> list[list[dict]]:
        queries = np.asarray(vectors, dtype=np.float32)
        found = await self.batches.search(owner, cid, queries, k, filter, caller or owner)
        return [
            [{"id": rid, "score": score, "metadata": meta or {}} for rid, score, meta in hits]
            for hits in found
        ]

    async def _search(
        self, owner: str, cid: str, queries: np.ndarray, k: int, filter: str, caller: str
    ):
        """One call of the engine for a batch of one caller's searches
        (:mod:`.search_batches`)."""
        body = {"cid": cid, "k": k, "filter": filter}
        if self.search_ef is not None:
            body["ef"] = self.search_ef
        answer = await self._call("search", owner, body, queries, what="search", caller=caller)
        return answer["results"]
