"""A stand-in for the Kubernetes API server: the one part of the cluster the tests fake.

It speaks enough of the REST API for the backend's real ``kubernetes_asyncio``
client, over real HTTP: discovery (``GET /apis``), and create / read / delete
of namespaced objects under any collection path, their replacement
(``PUT``) and JSON merge patches (``PATCH``, RFC 7386). It stores what it is
sent, records every request, answers 404 and 409 with ``Status`` objects as
the real one does, and lets a test set an object's ``status`` (the
controllers' part). It runs no controllers and checks
no schemas.
"""

from __future__ import annotations

import json
import socket

from aiohttp import web


def merge_patch(target, patch):
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def status_response(code: int, reason: str, message: str) -> web.Response:
    """A failure answered as the API server does: a ``Status`` object with ``code``."""
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "reason": reason,
            "message": message,
            "code": code,
        },
        status=code,
    )


class FakeApiServer:
    def __init__(self, groups: tuple[str, ...] = ("batch", "apps")):
        self.groups = list(groups)
        self.objects: dict[str, dict] = {}  # "<collection path>/<name>" -> object
        self.requests: list[tuple[str, str, dict | None]] = []
        self.port = 0
        self._runner = None

    # -- what tests use --------------------------------------------------------------
    def kubeconfig(self, path) -> str:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}
                    ],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
                    "current-context": "fake",
                    "users": [{"name": "u", "user": {"token": "fake-token"}}],
                }
            )
        )
        return str(path)

    def get(self, collection: str, name: str) -> dict | None:
        return self.objects.get(f"{collection}/{name}")

    def set_status(self, collection: str, name: str, status: dict) -> None:
        self.objects[f"{collection}/{name}"]["status"] = status

    # -- the server ------------------------------------------------------------------
    async def start(self) -> FakeApiServer:
        app = web.Application()
        app.router.add_get("/apis", self._discovery)
        app.router.add_get("/apis/", self._discovery)
        app.router.add_route("*", "/{path:.*}", self._objects)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _discovery(self, request):
        self.requests.append(("GET", "/apis", None))
        return web.json_response(
            {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                        "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                    }
                    for g in self.groups
                ],
            }
        )

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, path, body))
        if request.method == "POST":
            key = f"{path}/{body['metadata']['name']}"
            if key in self.objects:
                return status_response(409, "AlreadyExists", f"{key} already exists")
            self.objects[key] = {**body, "metadata": {**body["metadata"], "uid": key}}
            return web.json_response(self.objects[key], status=201)
        key = path[: -len("/status")] if path.endswith("/status") else path
        if key not in self.objects:
            return status_response(404, "NotFound", f"{key} not found")
        if request.method == "GET":
            return web.json_response(self.objects[key])
        if request.method == "PUT":
            # A replace: the new spec, the status the controllers wrote kept (as for an
            # object with a status subresource).
            if body["metadata"]["name"] != key.rsplit("/", 1)[1]:
                return status_response(
                    400, "BadRequest", "the name in the body does not match the URL"
                )
            old = self.objects[key]
            self.objects[key] = {**body, "metadata": {**body["metadata"], "uid": key}}
            if "status" in old:
                self.objects[key]["status"] = old["status"]
            return web.json_response(self.objects[key])
        if request.method == "PATCH":
            kind = request.content_type
            if kind != "application/merge-patch+json":
                return status_response(
                    415, "UnsupportedMediaType", f"this server merges only, not {kind}"
                )
            old = self.objects[key]
            # Metadata merges too (labels, ownerReferences), but never its name or uid.
            meta = merge_patch(old["metadata"], body.get("metadata") or {})
            meta.update(name=old["metadata"]["name"], uid=old["metadata"]["uid"])
            self.objects[key] = {**merge_patch(old, body), "metadata": meta}
            return web.json_response(self.objects[key])
        if request.method == "DELETE":
            # Foreground deletion would wait for the pods; this server has none.
            del self.objects[key]
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return status_response(405, "MethodNotAllowed", request.method)
