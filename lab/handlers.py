"""The server extension's routes under ``<base_url>/gpulab/``.

- ``GET gpulab/slice``: this server's slice in words (:mod:`.slice_info`), with the
  GPU model from the service's inventory and the memory in use when measurable.
- ``GET|POST|DELETE gpulab/api/v1/<path>``: the gpulab service's REST API, called
  with this server's hub token (:mod:`.service_proxy`).
- ``POST gpulab/try/<user>/<name>/<path>``: one call to an endpoint the user may call
  (the lab's "Try it"), through the service's endpoint front with the same token;
  the service checks, as for any call, that it is the user's or shared with them.
- ``POST gpulab/hibernate``: every kernel saves its variables to the user's files
  (:mod:`.hibernate`); the service calls it before it stops the server.
- ``GET gpulab/activity``: work going on besides the kernels' cells (processes,
  threads, terminals: :mod:`.activity`); the service's idle rule asks it.

Both are jupyter_server ``APIHandler`` s behind ``@web.authenticated``: only whoever
may use this server (its owner, through the hub's login) reaches them, and
jupyter_server checks XSRF on cookie-authenticated POST and DELETE.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .gpu_memory import used_mib
from .service_proxy import HUB_DOWN_HINT, ServiceError, call_service, error_text, safe_path
from .settings import GpuLabLab
from .slice_info import describe, read_slice


class GpuLabHandler(APIHandler):
    #: What jupyter_server's authorizer is asked about (``@authorized``: read for GET,
    #: write for POST and DELETE): a site whose authorizer gives a server's sharers
    #: read-only access keeps them from acting with the owner's token here.
    auth_resource = "gpulab"

    def initialize(self, lab: GpuLabLab):
        self.lab = lab

    def write_error(self, status_code, **kwargs):
        # {"error": ...} as the gpulab service answers, not jupyter_server's {"message"}.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.finish(json.dumps({"error": message}))

    def fail(self, status: int, message: str):
        self.set_status(status)
        self.finish(json.dumps({"error": message}))

    async def service(
        self,
        method: str,
        path: str,
        query: str = "",
        body: bytes | None = None,
        endpoint: bool = False,
        gateway: bool = False,
    ):
        return await call_service(
            method,
            path,
            query,
            body,
            connect_timeout=self.lab.connect_timeout,
            request_timeout=self.lab.request_timeout,
            endpoint=endpoint,
            gateway=gateway,
        )

    async def pass_on(
        self,
        method: str,
        target: str,
        query: str,
        body: bytes | None,
        endpoint: bool = False,
        gateway: bool = False,
    ):
        """Send the request on to the service (``endpoint``: to its endpoint front) and
        answer with what it answered; a body over the cap is refused here (413)."""
        if body is not None and len(body) > self.lab.max_body_bytes:
            return self.fail(
                413,
                f"request body of {len(body)} bytes is over the {self.lab.max_body_bytes} "
                "bytes this server passes on",
            )
        try:
            answer = await self.service(method, target, query, body or None, endpoint, gateway)
        except ServiceError as e:
            return self.fail(e.status, e.message)
        self.set_status(answer.status)
        if answer.status >= 400 and "json" not in answer.content_type:
            # The hub's proxy answers 503 with an HTML page when the service is down.
            text = error_text(answer.body, "error")
            if answer.status in (502, 503):
                text = f"gpulab service unreachable ({answer.status}) — {HUB_DOWN_HINT}"
            return self.fail(answer.status, text)
        # APIHandler.finish sets the type it is given (JSON unless told).
        self.finish(answer.body, set_content_type=answer.content_type or "application/json")


class SliceHandler(GpuLabHandler):
    # The status bar polls this every few seconds: that is not the user at work, and
    # must not keep an idle server from being culled.
    _track_activity = False

    #: uuid -> the inventory's GPU, and when it was read (one dict per server process).
    models: dict[str, dict] = {}
    models_read = 0.0

    async def gpu_models(self) -> tuple[dict[str, dict], str | None]:
        cls = type(self)
        if cls.models and time.monotonic() - cls.models_read < self.lab.inventory_ttl:
            return cls.models, None
        try:
            answer = await self.service("GET", "inventory")
        except ServiceError as e:
            return cls.models, e.message
        if answer.status != 200:
            return cls.models, error_text(answer.body, "inventory refused")
        cls.models = {
            g["uuid"]: g for node in answer.json().get("nodes", []) for g in node.get("gpus", [])
        }
        cls.models_read = time.monotonic()
        return cls.models, None

    @web.authenticated
    @authorized
    async def get(self):
        s = read_slice(dict(os.environ))
        models, problem = (await self.gpu_models()) if s["managed"] and s["gpus"] else ({}, None)
        used, note = await asyncio.to_thread(used_mib, s["gpus"], s["simulated"])
        out = describe(s, models, used, note)
        out["service_problem"] = problem
        self.finish(out)


class ProxyHandler(GpuLabHandler):
    async def forward(self, method: str, path: str):
        # The panel polls with GET; only what the user does (POST, DELETE) is activity.
        self._track_activity = method != "GET"
        target = safe_path(path)
        if target is None:
            return self.fail(400, f"not a gpulab API path: {path!r}")
        if self.get_argument("follow", "").lower() in ("1", "true", "yes"):
            return self.fail(400, "follow=true streams forever: poll the logs instead")
        body = self.request.body if method in ("POST", "PATCH") else None
        await self.pass_on(method, target, self.request.query, body)

    @web.authenticated
    @authorized
    async def get(self, path):
        await self.forward("GET", path)

    @web.authenticated
    @authorized
    async def post(self, path):
        await self.forward("POST", path)

    @web.authenticated
    @authorized
    async def delete(self, path):
        await self.forward("DELETE", path)


class TryHandler(GpuLabHandler):
    """One call to an endpoint from the lab's "Try it" view: its answer, whatever the
    status (the view shows a refusal as it shows a result)."""

    @web.authenticated
    @authorized
    async def post(self, path):
        target = safe_path(path)
        if target is None or target.count("/") < 2:
            return self.fail(400, f"not an endpoint call: {path!r}; expected <user>/<name>/v2/...")
        await self.pass_on("POST", target, "", self.request.body, endpoint=True)


class ChatHandler(GpuLabHandler):
    """One chat turn from the lab's "Try it" of a language model: the body (OpenAI's
    chat request, not streamed) goes to the service's gateway, ``<service>/v1/chat/
    completions``, with this server's token; the answer comes back whatever its status."""

    @web.authenticated
    @authorized
    async def post(self):
        try:
            request = json.loads(self.request.body or b"null")
        except (ValueError, RecursionError):  # nested past Python's limit
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            return self.fail(400, 'a chat turn is a JSON object with "model" and "messages"')
        if request.get("stream"):
            return self.fail(400, '"stream": true is not passed on here; leave it out')
        await self.pass_on("POST", "chat/completions", "", self.request.body, gateway=True)


def setup_handlers(serverapp) -> None:
    """Add the routes to a jupyter_server's web application."""
    from .activity import ActivityHandler
    from .hibernate import HibernateHandler

    lab = GpuLabLab(parent=serverapp)
    web_app = serverapp.web_app
    base = url_path_join(web_app.settings["base_url"], "gpulab")
    kw = {"lab": lab}
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "slice"), SliceHandler, kw),
            (url_path_join(base, "api/v1/(.+)"), ProxyHandler, kw),
            (url_path_join(base, "try/(.+)"), TryHandler, kw),
            (url_path_join(base, "chat"), ChatHandler, kw),
            (url_path_join(base, "hibernate"), HibernateHandler, kw),
            (url_path_join(base, "activity"), ActivityHandler, kw),
        ],
    )
    serverapp.log.info("gpulab: JupyterLab routes under %s", base)
