"""Vector collections from a notebook: ``Collection("docs", dim=384)``.

    from gpulab.client import Collection
    docs = Collection("docs", dim=384)              # yours; made if it does not exist
    docs = Collection("docs", embed="minilm")       # texts embedded by your endpoint
    docs.insert(vectors=X, metadata=[{...}, ...])   # numpy [n, dim] or lists; -> ids
    docs.insert(texts=["...", ...], metadata=...)   # with embed=
    hits = docs.search(vector=q, k=10)              # or text="...", filter={"lang": "en"}
    hits[0].id, hits[0].score, hits[0].metadata
    docs.count(); docs.share(users=["bob"]); docs.drop()
    Collection("alice/docs")                        # one alice shared with you

Scores: cosine and ip, higher is closer; l2, the squared distance (lower is closer).
Inserts of more rows than one request takes go in batches.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .errors import BadRequest, ConfigurationError, NotFound

#: Rows per request (the service's default cap, c.GpuLabService.collection_max_rows).
BATCH = 1000


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

    def __getitem__(self, key: str):  # hit["id"] as well as hit.id
        return getattr(self, key)


def _lists(vectors) -> list:
    tolist = getattr(vectors, "tolist", None)
    return tolist() if tolist is not None else [list(map(float, v)) for v in vectors]


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
            if owner and owner != self._me():
                raise
            if dim is None and embed is None:
                raise BadRequest(
                    400, f"you have no collection {short!r}: give dim= (or embed=) to make it"
                ) from None
            self.info = self.client.create_collection(short, dim=dim, embed=embed, metric=metric)
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

    def _write(self, verb, vectors, texts, metadata, ids, batch) -> list[str]:
        if (vectors is None) == (texts is None):
            raise BadRequest(400, "give vectors= or texts=")
        rows = _lists(vectors) if vectors is not None else list(texts)
        key = "vectors" if vectors is not None else "texts"
        out: list[str] = []
        for start in range(0, len(rows), batch):
            end = start + batch
            body = {key: rows[start:end]}
            if metadata is not None:
                body["metadata"] = list(metadata[start:end])
            if ids is not None:
                body["ids"] = list(ids[start:end])
            out += self._call(verb, body)["ids"]
            if len(rows) > batch:  # long work shows its progress
                print(f"\r{verb}: {len(out)}/{len(rows)} rows", end="", file=sys.stderr)
        if len(rows) > batch:
            print(file=sys.stderr)
        return out

    def insert(self, vectors=None, texts=None, metadata=None, ids=None, batch: int = BATCH):
        """Add rows; returns their ids (new ones where ``ids`` is not given). An id the
        collection holds already is refused (409): use :meth:`upsert`."""
        return self._write("insert", vectors, texts, metadata, ids, batch)

    def upsert(self, vectors=None, texts=None, metadata=None, ids=None, batch: int = BATCH):
        """Add rows or replace those with the same ids."""
        return self._write("upsert", vectors, texts, metadata, ids, batch)

    def delete(self, ids) -> int:
        """Remove the rows of these ids; returns how many there were."""
        return self._call("delete", {"ids": list(ids)})["deleted"]

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
        return [Hit(**h) for h in self._call("search", body)["hits"]]

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
