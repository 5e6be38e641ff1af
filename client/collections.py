"""Vector collections from a notebook: ``Collection("docs", dim=384)``.

    from gpulab.client import Collection
    docs = Collection("docs", dim=384)              # yours; made if it does not exist
    docs = Collection("docs", embed="minilm")       # texts embedded by your endpoint
    docs.insert(vectors=X, metadata=[{...}, ...])   # numpy [n, dim] or lists; -> ids
    docs.insert(texts=["...", ...], metadata=...)   # with embed=
    docs.insert(texts=books, chunk_size=1000, chunk_overlap=200)  # long ones in chunks
    docs.insert(vectors=X, texts=[...])             # your own vectors, texts kept with them
    docs.insert(df)                                 # rows: a DataFrame, list of dicts, or
    docs.insert("rows.parquet")                     # a .parquet / .jsonl file, in batches
    hits = docs.search(vector=q, k=10)              # or text="...", filter={"lang": "en"}
    hits[0].id, hits[0].score, hits[0].metadata, hits[0].text
    docs.count(); docs.share(users=["bob"]); docs.drop()
    Collection("alice/docs")                        # one alice shared with you

Scores: cosine and ip, higher is closer; l2, the squared distance (lower is closer).
Inserts of more rows than one request takes go in batches, with a progress bar. A row
made from a text
keeps it: its hit's ``text`` is what was found (None for rows of vectors alone).
For LangChain and LlamaIndex: :mod:`gpulab.client.langchain`, :mod:`gpulab.client.llama_index`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import os
from dataclasses import dataclass, field

import numpy as np

from . import bulk
from .chunking import chunk_text
from .errors import BadRequest, ConfigurationError, NotFound

#: Rows per request (the service's default cap, c.VectorSettings.collection_max_rows).
BATCH = 1000
#: Requests of one insert or upsert in flight at once.
IN_FLIGHT = 4


class CollectionsAPI:
    """The REST calls (a mixin of :class:`~.base.AsyncClient`)."""

    async def collections(self) -> list[dict]:
        """Your collections and those shared with you (admins: all)."""
        return await self.request("GET", "/collections")

    async def collection(self, owner: str, name: str) -> dict:
        return await self.request("GET", f"/collections/{owner}/{name}")

    async def create_collection(self, name: str, **settings) -> dict:
        body = {"name": name, **{k: v for k, v in settings.items() if v is not None}}
        return await self.request("POST", "/collections", body)

    async def collection_call(self, owner: str, name: str, verb: str, body: dict) -> dict:
        """``insert``, ``upsert``, ``delete`` or ``search``."""
        return await self.request("POST", f"/collections/{owner}/{name}/{verb}", body)

    async def share_collection(self, owner: str, name: str, body: dict) -> dict:
        return await self.request("PATCH", f"/collections/{owner}/{name}", body)

    async def drop_collection(self, owner: str, name: str) -> dict:
        return await self.request("DELETE", f"/collections/{owner}/{name}")


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    metadata: dict = field(default_factory=dict)
    #: The text the row was made from (None for a row of vectors alone).
    text: str | None = None

    def __getitem__(self, key: str):  # hit["id"] as well as hit.id
        return getattr(self, key)


def _lists(vectors) -> list:
    tolist = getattr(vectors, "tolist", None)
    return tolist() if tolist is not None else [list(map(float, v)) for v in vectors]


def _packed(vectors) -> np.ndarray | None:
    """The vectors as one (n, dim) float32 array, sent as ``vectors_base64`` (a string
    the service decodes at once, where 384,000 numbers in JSON take a second each way);
    None for what is not such an array (ragged, not numbers): sent as lists, and the
    service says what is wrong."""
    try:
        packed = np.asarray(vectors, dtype="<f4")
    except (TypeError, ValueError):
        return None
    return packed if packed.ndim == 2 and packed.size else None


class Collection:
    def __init__(
        self,
        name: str,
        dim: int | None = None,
        embed: str | None = None,
        metric: str = "cosine",
        client=None,
    ):
        from .base import Client

        self.client = client if client is not None else Client()
        owner, _, short = name.rpartition("/")
        self.owner = owner or self._me()
        self.name = short
        try:
            self.info = self.client.collection(self.owner, short)
        except NotFound:
            # Another's that is not there; outside a server (no JUPYTERHUB_USER) the
            # service makes it as the token's user, who must be that owner.
            if owner and owner != os.environ.get("JUPYTERHUB_USER", owner):
                raise
            if dim is None and embed is None:
                raise BadRequest(
                    400, f"you have no collection {short!r}: give dim= (or embed=) to make it"
                ) from None
            self.info = self.client.create_collection(short, dim=dim, embed=embed, metric=metric)
            if self.info["owner"] != self.owner:
                raise BadRequest(
                    400, f"this token is {self.info['owner']}'s: {self.owner} has no {short!r}"
                ) from None
            return
        if dim is not None and dim != self.info["dim"]:
            raise BadRequest(
                400, f"{self.owner}/{short} exists with {self.info['dim']}-d vectors, not {dim}-d"
            )

    @staticmethod
    def _me() -> str:
        me = os.environ.get("JUPYTERHUB_USER")
        if not me:
            raise ConfigurationError(
                0, "who are you? set JUPYTERHUB_USER (servers have it) or give owner/name"
            )
        return me

    def __repr__(self) -> str:
        return f"Collection({self.owner}/{self.name!s}, dim={self.info['dim']})"

    def _call(self, verb: str, body: dict) -> dict:
        return self.client.collection_call(self.owner, self.name, verb, body)

    @property
    def embed(self) -> str | None:
        """The endpoint that embeds its texts (``owner/name``), or None."""
        return self.info.get("embed")

    def _write(
        self, verb, vectors, texts, metadata, ids, batch, chunk_size=None, chunk_overlap=200
    ) -> list[str]:
        if vectors is None and texts is None:
            raise BadRequest(400, "give vectors= or texts= (or both: texts kept with vectors)")
        if chunk_size is not None:
            if texts is None or vectors is not None:
                raise BadRequest(400, "chunk_size= cuts texts=: give texts alone to chunk them")
            texts, metadata, ids = chunked(texts, metadata, ids, chunk_size, chunk_overlap)
        columns = {}
        packed = None if vectors is None else _packed(vectors)
        if packed is not None:
            columns["vectors_base64"] = packed
        elif vectors is not None:
            columns["vectors"] = _lists(vectors)
        if texts is not None:
            columns["texts"] = list(texts)
        n = len(next(iter(columns.values())))
        if any(len(c) != n for c in columns.values()):
            raise BadRequest(400, f"{len(columns['texts'])} texts for {n} vectors: one text each")

        def bodies():
            for start in range(0, n, batch):
                end = min(start + batch, n)
                body = {key: column[start:end] for key, column in columns.items()}
                if packed is not None:
                    body["vectors_base64"] = base64.b64encode(packed[start:end].tobytes()).decode()
                if metadata is not None:
                    body["metadata"] = list(metadata[start:end])
                if ids is not None:
                    body["ids"] = list(ids[start:end])
                yield end - start, body

        bar = bulk.progress_bar(n, verb) if n > batch else None  # long work shows progress
        return self._sent(verb, bodies(), bar)

    def _write_rows(self, verb: str, source, batch: int) -> list[str]:
        """Rows of a table (:mod:`.bulk`), a request per ``batch``, with a progress bar."""
        total, chunks = bulk.batches(source, batch)

        def bodies():
            first = 0
            for rows in chunks:
                body = bulk.body_of(rows, first)
                vectors = body.get("vectors")
                packed = None if vectors is None else _packed(vectors)
                if packed is not None:
                    body["vectors_base64"] = base64.b64encode(packed.tobytes()).decode()
                    del body["vectors"]
                first += len(rows)
                yield len(rows), body

        return self._sent(verb, bodies(), bulk.progress_bar(total, verb))

    def _sent(self, verb: str, bodies, bar) -> list[str]:
        """Each (rows, body) as a request, ``IN_FLIGHT`` at a time (the service checks
        one while the engine writes another); the ids in the order sent. The first
        refusal is raised once the requests in flight have been answered (batches
        before it are written, as are those in flight that were not refused)."""
        out: list[str] = []
        flying: collections.deque = collections.deque()
        from .base import client_loop  # base imports this module

        loop = client_loop()

        def land() -> None:
            rows, future = flying.popleft()
            out.extend(future.result()["ids"])
            if bar is not None:
                bar.update(rows)

        try:
            for rows, body in bodies:
                call = self.client.aio.collection_call(self.owner, self.name, verb, body)
                flying.append((rows, asyncio.run_coroutine_threadsafe(call, loop)))
                if len(flying) >= IN_FLIGHT:
                    land()
            while flying:
                land()
        finally:
            for _, future in flying:  # after a refusal: let those in flight finish
                with contextlib.suppress(Exception):
                    future.result()
            if bar is not None:
                bar.close()
        return out

    def insert(
        self,
        vectors=None,
        texts=None,
        metadata=None,
        ids=None,
        batch: int = BATCH,
        chunk_size: int | None = None,
        chunk_overlap: int = 200,
    ):
        """Add rows; returns their ids (new ones where ``ids`` is not given). An id the
        collection holds already is refused (409): use :meth:`upsert`.

        ``texts`` alone are embedded by the collection's endpoint; with ``vectors``
        they are kept beside them (one each), as the hits' ``text``. ``chunk_size``
        (characters) cuts each text into chunks (:func:`~.chunking.chunk_text`): a row
        each, whose metadata names its ``source`` (the text's ``metadata["source"]``,
        its id, or its position in ``texts``), ``chunk`` (0, 1, ...) and ``start`` (its
        first character in the text); the ids given become ``ID#0``, ``ID#1``, ...

        Many rows at once: ``insert(rows)`` takes a list of dicts, a pandas DataFrame or
        a ``.parquet``/``.jsonl`` file (:mod:`.bulk`: columns ``id``, ``vector`` or
        ``embedding``, ``text``, ``metadata`` or any others as metadata), sent
        ``batch`` rows a request with a progress bar; texts are embedded by the
        service in batches through the endpoint's batcher."""
        if bulk.is_table(vectors):
            return self._write_rows("insert", vectors, batch)
        return self._write(
            "insert", vectors, texts, metadata, ids, batch, chunk_size, chunk_overlap
        )

    def upsert(
        self,
        vectors=None,
        texts=None,
        metadata=None,
        ids=None,
        batch: int = BATCH,
        chunk_size: int | None = None,
        chunk_overlap: int = 200,
    ):
        """Add rows or replace those with the same ids (rows of a table as for
        :meth:`insert`)."""
        if bulk.is_table(vectors):
            return self._write_rows("upsert", vectors, batch)
        return self._write(
            "upsert", vectors, texts, metadata, ids, batch, chunk_size, chunk_overlap
        )

    def delete(self, ids=None, filter=None) -> int:
        """Remove the rows of these ids, or those the ``filter`` matches (as
        :meth:`search` takes it); returns how many there were."""
        if (ids is None) == (filter is None):
            raise BadRequest(400, "give ids= or filter=")
        if ids is not None:
            return self._call("delete", {"ids": list(ids)})["deleted"]
        # The matching rows, found a search's worth at a time (a filtered search
        # returns only rows that match, whatever the probe vector) and deleted.
        probe = [1.0] * self.info["dim"]
        deleted = 0
        while hits := self.search(vector=probe, k=1000, filter=filter):
            gone = self._call("delete", {"ids": [h.id for h in hits]})["deleted"]
            if not gone:  # found again but already deleted: nothing more to do
                break
            deleted += gone
        return deleted

    def search(self, vector=None, text=None, k: int = 10, filter=None) -> list[Hit]:
        """The ``k`` nearest rows, nearest first. ``filter``: ``{"lang": "en"}`` or an
        expression (``'metadata["year"] > 2020'``; the grammar is in the how-to's
        Filters: ==, <, in, like, and/or/not over ``metadata[...]`` and ``id``)."""
        if (vector is None) == (text is None):
            raise BadRequest(400, "give vector= or text=")
        body = {"vector": _lists([vector])[0]} if vector is not None else {"text": text}
        body["k"] = k
        if filter is not None:
            body["filter"] = filter
        fields = set(Hit.__dataclass_fields__)
        hits = self._call("search", body)["hits"]
        return [Hit(**{k: v for k, v in h.items() if k in fields}) for h in hits]

    def count(self) -> int:
        return self.client.collection(self.owner, self.name)["count"]

    def share(self, users=None, groups=None) -> dict:
        """Who else may use it (replaces the lists given)."""
        body = {}
        if users is not None:
            body["share_users"] = list(users)
        if groups is not None:
            body["share_groups"] = list(groups)
        self.info = self.client.share_collection(self.owner, self.name, body)
        return self.info

    def drop(self) -> None:
        """Remove it and every row (owner and admins)."""
        self.client.drop_collection(self.owner, self.name)


def chunked(texts, metadata, ids, chunk_size: int, chunk_overlap: int):
    """Each text's chunks as rows: (texts, metadata, ids) of the chunks."""
    texts = list(texts)
    if metadata is not None and len(metadata) != len(texts):
        raise BadRequest(400, f"{len(metadata)} metadata for {len(texts)} texts: one each")
    if ids is not None and len(ids) != len(texts):
        raise BadRequest(400, f"{len(ids)} ids for {len(texts)} texts: one each")
    out_texts, out_meta, out_ids = [], [], []
    for i, text in enumerate(texts):
        meta = dict(metadata[i]) if metadata is not None else {}
        source = meta.pop("source", ids[i] if ids is not None else i)
        try:
            pieces = chunk_text(text, chunk_size, chunk_overlap)
        except ValueError as e:
            raise BadRequest(400, str(e)) from None
        for j, (start, piece) in enumerate(pieces):
            out_texts.append(piece)
            out_meta.append({**meta, "source": source, "chunk": j, "start": start})
            if ids is not None:
                out_ids.append(f"{ids[i]}#{j}")
    return out_texts, out_meta, (out_ids if ids is not None else None)
