"""The client of a Milvus cluster (``c.VectorSettings.vector_engine_uri``): Milvus's API
(pymilvus), called from a thread pool (pymilvus blocks). The embedded engine has a
client of its own with the same calls (:mod:`.embedded`); the errors, the owner's
database name and the hints here are shared by both.

Users' data never mixes: each owner has a database of their own in the engine
(:func:`database_of`), and the service alone names it; a collection's engine name is
the id of its row, never a name a user chose. Engine errors that come from the
request (a filter that does not parse) become :class:`EngineError` 400s; the engine
down or restarting, 503; a call that runs past ``call_timeout`` is abandoned (the
engine is told its deadline too) and answered 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from . import filters
from .owner_queues import OwnerQueues

log = logging.getLogger("gpulab.service.vectors")

#: Milvus's metric names for ours.
METRICS = {"cosine": "COSINE", "l2": "L2", "ip": "IP"}
INDEXES = {"hnsw": ("HNSW", {"M": 16, "efConstruction": 200}), "flat": ("FLAT", {})}
ID_MAX = 256  # characters of a row id
THREADS = 8
#: What a call past its limit is told, by what it was doing.
ABANDONED_HINTS = {
    "search": "narrow it (fewer queries, a smaller k, a simpler filter) or try again",
    "write": "its rows may be in or not: upsert them again",
}


class EngineError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class IdsTaken(EngineError):
    """An insert refused whole: ``n`` of its ids are in the collection already
    (``ids``: the first few, sorted). The manager names the collection."""

    def __init__(self, ids: list[str], n: int):
        super().__init__(409, f"{n} of these ids are in the collection already")
        self.ids, self.n = ids, n


def database_of(owner: str) -> str:
    """The engine database of ``owner``'s collections: a name only the service makes
    (Milvus's names allow letters, digits and ``_``; a hub name may hold anything)."""
    return "u_" + hashlib.sha256(owner.encode()).hexdigest()[:32]


class VectorEngine:
    #: A filter as Milvus reads it.
    filter_text = staticmethod(filters.to_milvus)

    def __init__(self, uri: str, token: str = "", call_timeout: float = 30.0):
        self.uri = uri
        self.token = token
        #: Seconds one call may take before it is abandoned (504).
        self.call_timeout = call_timeout
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="gpulab-vectors")
        self.queues = OwnerQueues(THREADS, THREADS // 2)
        #: (owner, cid) -> its writes one at a time: an insert's look for its ids and
        #: its write are one step (Milvus's insert keeps a second row of an id).
        self._writes: dict[tuple[str, str], asyncio.Lock] = {}
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()
        # pymilvus logs every refused call at ERROR with its traceback (30 lines for a
        # user's bad request); the caller gets the reason and the log one line. Its
        # import configures its loggers, so it is imported first, then quietened.
        import pymilvus  # noqa: F401

        for name in ("pymilvus", "pymilvus.milvus_client"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    # -- plumbing ----------------------------------------------------------------------
    def _client(self, db: str):
        from pymilvus import MilvusClient

        with self._lock:
            client = self._clients.get(db)
        if client is not None:
            return client
        limit = self.call_timeout
        admin = MilvusClient(uri=self.uri, token=self.token, timeout=limit)
        try:
            if db not in admin.list_databases(timeout=limit):
                try:
                    admin.create_database(db, timeout=limit)
                except Exception:  # made by a concurrent call meanwhile?
                    if db not in admin.list_databases(timeout=limit):
                        raise
        finally:
            admin.close()
        client = MilvusClient(uri=self.uri, token=self.token, db_name=db, timeout=limit)
        with self._lock:
            return self._clients.setdefault(db, client)

    async def _call(
        self,
        fn,
        owner: str | None = None,
        cid: str | None = None,
        what: str = "call",
        limited: bool = True,
        caller: str | None = None,
    ):
        """``fn()`` in the pool; a collection the engine has not loaded (it started again
        since) is loaded and ``fn`` tried once more. ``limited``: past ``call_timeout``
        the caller gets a 504 (the pymilvus call carries the same deadline, so the
        pool's thread is free again then too). ``caller``: whose work queue it waits
        in (the user who asked; else the owner's)."""
        loop = asyncio.get_running_loop()

        def run():
            try:
                return fn()
            except Exception as e:
                if cid is None or "load()" not in str(e):
                    raise
            self._client(database_of(owner)).load_collection(cid, timeout=self.call_timeout)
            return fn()

        async def in_pool():
            return await loop.run_in_executor(self.pool, run)

        # A caller's calls take at most half the pool's threads (whosever collections
        # they are): a slow caller's searches queue behind each other, not in front of
        # everyone's.
        queue = caller or owner
        work = in_pool() if queue is None else self.queues.run(queue, in_pool)
        try:
            if not limited:
                return await work
            # A moment past the engine's own deadline: its answer says more than ours.
            return await asyncio.wait_for(work, self.call_timeout + 1)
        except EngineError:
            raise
        except TimeoutError:
            raise self._abandoned(what) from None
        except Exception as e:
            if _past_deadline(e):
                raise self._abandoned(what) from None
            raise _translated(e) from e

    def _abandoned(self, what: str) -> EngineError:
        hint = ABANDONED_HINTS.get(what, "try again")
        return EngineError(
            504,
            f"the vector engine did not finish this {what} within {self.call_timeout:g} s "
            f"(c.VectorSettings.vector_call_timeout), so it was abandoned: {hint}",
        )

    async def ping(self, timeout: float) -> bool:
        """Whether the engine answers a call (not only its socket) within ``timeout``."""

        def ping():
            from pymilvus import MilvusClient

            client = MilvusClient(uri=self.uri, token=self.token, timeout=timeout)
            try:
                client.list_databases(timeout=timeout)
            finally:
                client.close()

        try:
            await asyncio.wait_for(asyncio.to_thread(ping), timeout + 1)
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()

    # -- collections -------------------------------------------------------------------
    async def create(self, owner: str, cid: str, dim: int, metric: str, index: str) -> None:
        def create():
            from pymilvus import DataType, MilvusClient

            client = self._client(database_of(owner))
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("metadata", DataType.JSON)
            params = client.prepare_index_params()
            kind, settings = INDEXES[index]
            params.add_index(
                "vector", index_type=kind, metric_type=METRICS[metric], params=settings
            )
            client.create_collection(
                cid, schema=schema, index_params=params, timeout=self.call_timeout
            )

        await self._call(create)

    async def drop(self, owner: str, cid: str) -> None:
        self._writes.pop((owner, cid), None)
        await self._call(
            lambda: self._client(database_of(owner)).drop_collection(cid, timeout=self.call_timeout)
        )

    async def write(
        self,
        owner: str,
        cid: str,
        rows: list[dict],
        upsert: bool,
        caller: str | None = None,
        new_ids: bool = False,
    ) -> None:
        """Insert (or upsert) ``rows`` ({id, vector, metadata}); done when the engine
        has them in its log (a kill -9 after this loses none). An insert whose ids are
        there already raises :class:`IdsTaken` and writes nothing; ``new_ids``: the
        service made them just now (none can be there)."""

        rows = [{**r, "vector": _floats(r["vector"])} for r in rows]

        def write():
            client = self._client(database_of(owner))
            (client.upsert if upsert else client.insert)(cid, rows, timeout=self.call_timeout)

        if not upsert and new_ids:
            await self._call(write, owner, cid, what="write", caller=caller)
            return
        # An upsert waits too: between an insert's look and its write it would put in
        # a row of an id the insert then writes again.
        lock = self._writes.setdefault((owner, cid), asyncio.Lock())
        async with lock:
            if not upsert:
                taken = sorted(await self.existing(owner, cid, [r["id"] for r in rows], caller))
                if taken:
                    raise IdsTaken(taken[:5], len(taken))
            await self._call(write, owner, cid, what="write", caller=caller)

    async def existing(
        self, owner: str, cid: str, ids: list[str], caller: str | None = None
    ) -> set[str]:
        """Which of ``ids`` the collection holds."""

        def get():
            rows = self._client(database_of(owner)).get(
                cid, ids=ids, output_fields=["id"], timeout=self.call_timeout
            )
            return {r["id"] for r in rows}

        return await self._call(get, owner, cid, caller=caller)

    async def delete(self, owner: str, cid: str, ids: list[str], caller: str | None = None) -> None:
        def delete():
            self._client(database_of(owner)).delete(cid, ids=ids, timeout=self.call_timeout)

        await self._call(delete, owner, cid, what="write", caller=caller)

    async def count(self, owner: str, cid: str, caller: str | None = None) -> int:
        def count():
            rows = self._client(database_of(owner)).query(
                cid, filter="", output_fields=["count(*)"], timeout=self.call_timeout
            )
            return int(rows[0]["count(*)"]) if rows else 0

        return await self._call(count, owner, cid, caller=caller)

    async def usage(self, owner: str, cid: str, caller: str | None = None) -> tuple[int, None]:
        """(rows, None): a Milvus cluster's memory is its own, not the service's to
        budget (c.VectorSettings.max_mib_per_user is the embedded engine's)."""
        return await self.count(owner, cid, caller), None

    async def stats(self, owner: str, cid: str, caller: str | None = None) -> dict:
        """The rows (the cluster indexes sealed segments itself, and says nothing here
        of what waits for its index)."""
        return {"count": await self.count(owner, cid, caller)}

    async def flush(self, owner: str, cid: str) -> None:
        """Seal what was written into indexed segments (searches then use the index).
        In the background, with no one waiting: no time limit (a big seal takes long)."""
        await self._call(
            lambda: self._client(database_of(owner)).flush(cid), owner, cid, limited=False
        )

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
        vectors = [_floats(v) for v in vectors]

        def search():
            return self._client(database_of(owner)).search(
                cid,
                data=vectors,
                limit=k,
                filter=filter,
                output_fields=["metadata"],
                search_params={"metric_type": METRICS[metric], "params": {"ef": max(64, k)}},
                timeout=self.call_timeout,
            )

        found = await self._call(search, owner, cid, what="search", caller=caller)
        return [
            [
                {"id": hit["id"], "score": float(hit["distance"]), "metadata": _metadata(hit)}
                for hit in hits
            ]
            for hits in found
        ]


def _floats(vector) -> list[float]:
    """A vector as pymilvus takes it (the service checks vectors into numpy arrays)."""
    return vector.tolist() if hasattr(vector, "tolist") else [float(x) for x in vector]


def _metadata(hit) -> dict:
    entity = hit.get("entity") or {}
    return entity.get("metadata") or {}


def _past_deadline(e: BaseException) -> bool:
    """A gRPC call that ran past the deadline it was given (as it comes out of pymilvus:
    the RpcError itself, or wrapped)."""
    import grpc

    deadline = grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(4):  # pymilvus raises ``e from e``: a chain that may loop on itself
        code = getattr(e, "code", None)
        if isinstance(e, grpc.RpcError) and callable(code) and code() == deadline:
            return True
        if "DEADLINE_EXCEEDED" in str(e) or "Deadline Exceeded" in str(e):
            return True
        if e.__cause__ is None:
            return False
        e = e.__cause__
    return False


def _translated(e: Exception) -> EngineError:
    """An engine failure as the caller should see it."""
    from pymilvus.exceptions import MilvusException

    if isinstance(e, MilvusException):
        message = " ".join(str(e.message).split())
        if e.code == 6:  # the request: a filter that does not parse, a wrong field
            return EngineError(400, message)
        if "does not exist" in message:
            return EngineError(404, message)
        if e.code == 2 or "connect" in message.lower() or "unavailable" in message.lower():
            return EngineError(503, "the vector engine is not answering (restarting?); try again")
        return EngineError(500, f"the vector engine failed: {message}")
    log.warning("Vector engine call failed: %s: %s", type(e).__name__, e)
    return EngineError(503, "the vector engine is not answering (restarting?); try again")
