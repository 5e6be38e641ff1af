"""Routes for vector collections (``/api/v1/collections``).

::

    GET    api/v1/collections                          yours, shared with you (admins: all);
                                                        share lists to owner and admins only
    POST   api/v1/collections                          {"name", "dim", "metric", "index",
                                                        "embed", "share_users", "share_groups"}
    GET    api/v1/collections/{owner}/{name}           one, with its row count
    PATCH  api/v1/collections/{owner}/{name}           sharing (owner, admins)
    DELETE api/v1/collections/{owner}/{name}           drop it and its rows (owner, admins)
    POST   api/v1/collections/{owner}/{name}/insert    {"ids"?, "vectors" | "texts", "metadata"?}
    POST   api/v1/collections/{owner}/{name}/upsert    the same; ids replace their rows
    POST   api/v1/collections/{owner}/{name}/delete    {"ids": [...]}
    POST   api/v1/collections/{owner}/{name}/search    {"vector" | "vectors" | "text" | "texts",
                                                        "k", "filter"}

Owner, admins and the users and groups a collection is shared with use it; to
anyone else it does not exist (403, never which). The work is the collection
manager's (:mod:`gpulab.service.vectors.manager`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import orjson
from tornado import web

from gpulab.service.api.request_body import JSON_BODY_LIMIT
from gpulab.service.auth import APIHandler
from gpulab.service.vectors import checks
from gpulab.service.vectors.checks import Refused
from gpulab.service.vectors.manager import CollectionManager


@contextlib.contextmanager
def refusals():
    """The manager's refusals as the HTTP errors they are (status and reason)."""
    try:
        yield
    except Refused as e:
        raise web.HTTPError(e.status, str(e)) from None


class _CollectionHandler(APIHandler):
    def json_body(self) -> dict:
        body = super().json_body()
        # "\ud800" is valid JSON but not text: refused here, not a 500 deep in the engine.
        with refusals():
            checks.unicode_text(body, self.raw_body())
        return body

    @property
    def collections(self) -> CollectionManager:
        manager = self.gpulab.vectors
        if manager is None:
            raise web.HTTPError(503, "vector collections are still starting; try again")
        return manager

    async def found(self, owner: str, name: str, manage: bool = False) -> dict:
        who = self.require_identity()
        self.audit_subject, self.audit_user = f"{owner}/{name}", owner
        with refusals():
            return await self.collections.find(who, owner, name, manage)


class CollectionsHandler(_CollectionHandler):
    audit_actions = {"POST": "collection.create"}

    async def get(self):
        who = self.require_identity()
        manager = self.collections
        self.write_json(await manager.views(who, await manager.visible(who)))

    async def post(self):
        who = self.require_identity()
        body = self.json_body()
        with refusals():
            view = await self.collections.create(who, body)
        await self.audit(
            "collection.create",
            view["collection"],
            user=view["owner"],
            dim=view["dim"],
            metric=view["metric"],
            embed=view["embed"],
        )
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{view['collection']}")
        self.write_json(view, 201)


class CollectionHandler(_CollectionHandler):
    audit_actions = {
        "GET": "collection.read",
        "PATCH": "collection.share",
        "DELETE": "collection.drop",
    }

    async def get(self, owner, name):
        row = await self.found(owner, name)
        with refusals():
            self.write_json(await self.collections.counted_view(self.identity, row))

    async def patch(self, owner, name):
        row = await self.found(owner, name, manage=True)
        body = self.json_body()
        with refusals():
            view = await self.collections.share(self.identity, row, body)
        await self.audit(
            "collection.share",
            view["collection"],
            user=owner,
            share_users=view["share_users"],
            share_groups=view["share_groups"],
        )
        self.write_json(view)

    async def delete(self, owner, name):
        row = await self.found(owner, name, manage=True)
        with refusals():
            await self.collections.drop(row)
        await self.audit("collection.drop", f"{owner}/{name}", user=owner)
        self.write_json({"dropped": f"{owner}/{name}"})


#: A rows or search body up to this size is parsed on the event loop.
PARSE_ON_LOOP_BYTES = 256 << 10


class RowsHandler(_CollectionHandler):
    audit_actions = {"POST": "collection.use"}
    #: Rows and queries are the only bodies past JSON_BODY_LIMIT (1 MiB).
    body_setting = "VectorSettings.collection_body_limit_mib"

    def body_limit(self) -> int:
        return max(JSON_BODY_LIMIT, self.gpulab.vector_settings.collection_body_limit_mib << 20)

    def changes_state(self) -> bool:
        # A search only reads: its token may be checked from the cache, as a GET's (a
        # round trip to the hub per query was most of a search's time). Writes ask the
        # hub each time, so a revoked token writes nothing.
        return not self.request.path.endswith("/search")

    async def post(self, owner, name, verb):
        row = await self.found(owner, name)
        # Up to collection_body_limit_mib of JSON: a large body is parsed and checked
        # off the event loop; a search's few KiB here (a thread costs more than it).
        if self._received > PARSE_ON_LOOP_BYTES:
            body = await asyncio.to_thread(self.json_body)
        else:
            body = self.json_body()
        manager = self.collections
        who = self.identity
        work = {
            "insert": lambda: manager.write(who, row, body, upsert=False),
            "upsert": lambda: manager.write(who, row, body, upsert=True),
            "delete": lambda: manager.delete(who, row, body),
            "search": lambda: manager.search(who, row, body),
        }[verb]
        with refusals():
            answer = await work()
        self.set_status(200)
        self.finish(encoded(answer))


def encoded(answer) -> bytes:
    """JSON of a route's answer by orjson (a search's 10 hits: 2 us, json's 22 us, on
    the service's one loop, per search); json's where orjson writes none (an integer
    past 64 bits in a row's metadata)."""
    try:
        return orjson.dumps(answer)
    except orjson.JSONEncodeError:
        return json.dumps(answer).encode()


OWNER_NAME = r"api/v1/collections/([^/]+)/([^/]+)"
routes = [
    (r"api/v1/collections", CollectionsHandler),
    (OWNER_NAME, CollectionHandler),
    (OWNER_NAME + r"/(insert|upsert|delete|search)", RowsHandler),
]
