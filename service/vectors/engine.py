"""The vector engine's client: Milvus's API (pymilvus) over the embedded engine's socket
or a Milvus cluster's address, called from a thread pool (pymilvus blocks).

Users' data never mixes: each owner has a database of their own in the engine
(:func:`database_of`), and the service alone names it; a collection's engine name is
the id of its row, never a name a user chose. Engine errors that come from the
request (a filter that does not parse) become :class:`EngineError` 400s; the engine
down or restarting, 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("gpulab.service.vectors")

#: Milvus's metric names for ours.
METRICS = {"cosine": "COSINE", "l2": "L2", "ip": "IP"}
INDEXES = {"hnsw": ("HNSW", {"M": 16, "efConstruction": 200}), "flat": ("FLAT", {})}
ID_MAX = 256  # characters of a row id
THREADS = 8


class EngineError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def database_of(owner: str) -> str:
    """The engine database of ``owner``'s collections: a name only the service makes
    (Milvus's names allow letters, digits and ``_``; a hub name may hold anything)."""
    return "u_" + hashlib.sha256(owner.encode()).hexdigest()[:32]


class VectorEngine:
    def __init__(self, uri: str, token: str = ""):
        self.uri = uri
        self.token = token
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="gpulab-vectors")
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()
        # pymilvus logs every refused call at ERROR: a user's bad filter is not ours.
        logging.getLogger("pymilvus").setLevel(logging.CRITICAL)

    # -- plumbing ----------------------------------------------------------------------
    def _client(self, db: str):
        from pymilvus import MilvusClient

        with self._lock:
            client = self._clients.get(db)
        if client is not None:
            return client
        admin = MilvusClient(uri=self.uri, token=self.token)
        try:
            if db not in admin.list_databases():
                try:
                    admin.create_database(db)
                except Exception:  # made by a concurrent call meanwhile?
                    if db not in admin.list_databases():
                        raise
        finally:
            admin.close()
        client = MilvusClient(uri=self.uri, token=self.token, db_name=db)
        with self._lock:
            return self._clients.setdefault(db, client)

    async def _call(self, fn, owner: str | None = None, cid: str | None = None):
        """``fn()`` in the pool; a collection the engine has not loaded (it started again
        since) is loaded and ``fn`` tried once more."""
        loop = asyncio.get_running_loop()

        def run():
            try:
                return fn()
            except Exception as e:
                if cid is None or "load()" not in str(e):
                    raise
            self._client(database_of(owner)).load_collection(cid)
            return fn()

        try:
            return await loop.run_in_executor(self.pool, run)
        except EngineError:
            raise
        except Exception as e:
            raise _translated(e) from e

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
            client.create_collection(cid, schema=schema, index_params=params)

        await self._call(create)

    async def drop(self, owner: str, cid: str) -> None:
        await self._call(lambda: self._client(database_of(owner)).drop_collection(cid))

    async def write(self, owner: str, cid: str, rows: list[dict], upsert: bool) -> None:
        """Insert (or upsert) ``rows`` ({id, vector, metadata}); done when the engine
        has them in its log (a kill -9 after this loses none)."""

        def write():
            client = self._client(database_of(owner))
            (client.upsert if upsert else client.insert)(cid, rows)

        await self._call(write, owner, cid)

    async def existing(self, owner: str, cid: str, ids: list[str]) -> set[str]:
        """Which of ``ids`` the collection holds."""

        def get():
            rows = self._client(database_of(owner)).get(cid, ids=ids, output_fields=["id"])
            return {r["id"] for r in rows}

        return await self._call(get, owner, cid)

    async def delete(self, owner: str, cid: str, ids: list[str]) -> None:
        await self._call(lambda: self._client(database_of(owner)).delete(cid, ids=ids), owner, cid)

    async def count(self, owner: str, cid: str) -> int:
        def count():
            rows = self._client(database_of(owner)).query(
                cid, filter="", output_fields=["count(*)"]
            )
            return int(rows[0]["count(*)"]) if rows else 0

        return await self._call(count, owner, cid)

    async def flush(self, owner: str, cid: str) -> None:
        """Seal what was written into indexed segments (searches then use the index)."""
        await self._call(lambda: self._client(database_of(owner)).flush(cid), owner, cid)

    async def search(
        self, owner: str, cid: str, vectors: list[list[float]], k: int, metric: str, filter: str
    ) -> list[list[dict]]:
        def search():
            return self._client(database_of(owner)).search(
                cid,
                data=vectors,
                limit=k,
                filter=filter,
                output_fields=["metadata"],
                search_params={"metric_type": METRICS[metric], "params": {"ef": max(64, k)}},
            )

        found = await self._call(search, owner, cid)
        return [
            [
                {"id": hit["id"], "score": float(hit["distance"]), "metadata": _metadata(hit)}
                for hit in hits
            ]
            for hits in found
        ]


def _metadata(hit) -> dict:
    entity = hit.get("entity") or {}
    return entity.get("metadata") or {}


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
