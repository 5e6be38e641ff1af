"""The gpulab service in the test's own process, with a fake hub API beside it.

For route logic (request validation, 400/413, caps, who may see what) that needs no
real JupyterHub, no proxy and no single-user servers. The service is the real one
(``gpulab.service.app.GpuLabService``: ``initialize()``, then ``make_app()``), served
on a random port inside the test's event loop, with its real database, ledger and
managers. Only the hub's REST API is a stand-in: :class:`FakeHubAPI`, a small
tornado app that answers the few routes the service asks (``/api/user`` for a
token, ``/api/users/{name}``, ``/api/users?state=active``, ``/api/groups``).

Anything end-to-end (spawns, job ranks, replicas, the proxy, OAuth in a browser)
belongs on a real hub (``hubproc.RunningHub``).

Requests go through ``requests`` in a worker thread, so the service keeps serving
on the test's loop meanwhile; tests using it are ``async``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from pathlib import Path
from urllib.parse import unquote

import requests
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import add_accept_handler, bind_sockets
from traitlets.config import Config

from support.loop_dump import dump_loop_state

log = logging.getLogger("tests.support.service")

SERVICE_NAME = "gpulab"
PREFIX = "/services/gpulab/"
SCOPES = [f"access:services!service={SERVICE_NAME}"]


class FakeHubAPI:
    """Stands in for JupyterHub's REST API: users, their tokens, groups, servers.

    Not JupyterHub: it knows only what the gpulab service asks of the hub. Tokens it
    hands out identify their user on ``GET /hub/api/user`` as the hub would, with the
    scope to use the gpulab service. Stopping a server only forgets it (``stopped``).
    """

    def __init__(self) -> None:
        self.users: dict[str, dict] = {}
        self.groups: dict[str, dict] = {}
        self.tokens: dict[str, dict] = {}
        #: The service's own token: it identifies the service (internal caller).
        self.service_token = secrets.token_hex(16)
        self.tokens[self.service_token] = {"kind": "service", "name": SERVICE_NAME}
        #: Servers stopped through the API ("user/name"), oldest first.
        self.stopped: list[str] = []
        #: Called with "user/name" as a server stops (a test's spawner giving its slice back).
        self.on_stop: list = []

    def add_user(self, name: str, admin: bool = False, groups=()) -> str:
        """Create the user (if needed) and return a fresh API token of theirs."""
        self.users.setdefault(
            name,
            {"kind": "user", "name": name, "admin": admin, "groups": list(groups), "servers": {}},
        )
        for g in groups:
            self.groups.setdefault(g, {"name": g, "users": [], "properties": {}})
            if name not in self.groups[g]["users"]:
                self.groups[g]["users"].append(name)
        token = secrets.token_hex(16)
        self.tokens[token] = {"kind": "user", "name": name}
        return token

    def make_app(self) -> web.Application:
        fake = self

        class Handler(web.RequestHandler):
            def write_json(self, data):
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(data))

            def page(self, items: list) -> list:
                offset = int(self.get_argument("offset", "0"))
                limit = int(self.get_argument("limit", "200"))
                return items[offset : offset + limit]

        class WhoAmI(Handler):
            def get(self):
                auth = self.request.headers.get("Authorization", "")
                who = fake.tokens.get(auth.partition(" ")[2].strip())
                if who is None:
                    raise web.HTTPError(403)
                model = (
                    dict(fake.users.get(who["name"], who)) if who["kind"] == "user" else dict(who)
                )
                self.write_json({**model, "scopes": SCOPES})

        class Users(Handler):
            def get(self):
                users = list(fake.users.values())
                if self.get_argument("state", None) == "active":
                    users = [u for u in users if u["servers"]]
                self.write_json(self.page(users))

        class User(Handler):
            def get(self, name):
                user = fake.users.get(unquote(name))
                if user is None:
                    raise web.HTTPError(404)
                self.write_json(user)

        class Groups(Handler):
            def get(self):
                self.write_json(self.page(list(fake.groups.values())))

        class Server(Handler):
            def delete(self, name, server=""):
                user = fake.users.get(unquote(name))
                if user is None or user["servers"].pop(unquote(server or ""), None) is None:
                    raise web.HTTPError(404)
                fake.stopped.append(f"{unquote(name)}/{unquote(server or '')}")
                for hook in fake.on_stop:
                    hook(fake.stopped[-1])
                self.set_status(204)

        return web.Application(
            [
                ("/hub/api/user", WhoAmI),
                ("/hub/api/users", Users),
                ("/hub/api/users/([^/]+)", User),
                ("/hub/api/groups", Groups),
                ("/hub/api/users/([^/]+)/server", Server),
                ("/hub/api/users/([^/]+)/servers/([^/]+)", Server),
            ]
        )


def listen(app, **kw) -> tuple[HTTPServer, int]:
    """``app`` served on a free port of 127.0.0.1: (its server, the port)."""
    [sock] = bind_sockets(0, "127.0.0.1")
    forget_stale_registration(sock.fileno())
    server = HTTPServer(app, **kw)
    server.add_sockets([sock])
    return server, sock.getsockname()[1]


def forget_stale_registration(fd: int) -> None:
    """A new socket's number may still be registered with the session's event loop by
    an earlier test's socket that was closed without being removed from it. asyncio
    would then only swap the callback, never asking the kernel to watch the new socket
    (``selectors`` ``modify`` with the same events): the server would never accept,
    and its callers would wait until they time out (seen on CI). Whatever is
    registered under a number just made is stale: it goes, and the log names it."""
    loop = asyncio.get_running_loop()
    key = loop._selector.get_map().get(fd)  # noqa: SLF001 - asyncio keeps no public view
    if key is None:
        return
    log.warning("fd %d was still registered with the event loop by %r; removed", fd, key.data)
    loop.remove_reader(fd)
    loop.remove_writer(fd)


class InProcessService:
    """A started service: ``url``/``api`` like :class:`hubproc.RunningHub`, and
    ``request``/``raw`` to call it from an async test."""

    def __init__(
        self, app, hub: FakeHubAPI, data_dir: Path, port: int, hub_server=None, server=None
    ):
        self.app = app  # the GpuLabService
        self.server = server  # its tornado HTTPServer
        self.fake_hub = hub
        #: The fake hub's HTTP server: a test stops it to see the service with the hub down.
        self.hub_server = hub_server
        self.data_dir = data_dir
        self.url = f"http://127.0.0.1:{port}"
        self.api = f"{self.url}{PREFIX}api/v1"
        self.admin_token = hub.add_user("admin", admin=True)

    def watch_listening_again(self) -> None:
        """The tests' services share one event loop. Three full runs saw a service whose
        listening socket the loop no longer watched (its fd missing from the loop's
        selector while the socket listened: an earlier test's socket with that number,
        closed late, took the registration with it), so it never accepted. Watch it
        again, and say so in the log."""
        if self.server is None or self.server._stopped:  # noqa: SLF001 - a test stopped it
            return
        loop = asyncio.get_running_loop()
        watched = loop._selector.get_map()  # noqa: SLF001 - asyncio keeps no public view
        io_loop = IOLoop.current()
        for fd, sock in list(self.server._sockets.items()):  # noqa: SLF001
            if fd in watched or sock.fileno() != fd:
                continue
            log.warning("fd %d (the service's listening socket) was not watched; again", fd)
            if fd in io_loop.handlers:  # tornado still has it: only asyncio forgot it
                loop.add_reader(fd, io_loop._handle_events, fd, IOLoop.READ)  # noqa: SLF001
            else:
                self.server._handlers[fd] = add_accept_handler(  # noqa: SLF001
                    sock,
                    self.server._handle_connection,  # noqa: SLF001
                )

    def create_user(self, name: str, **kw) -> str:
        return self.fake_hub.add_user(name, **kw)

    def auth(self, token: str | None = None) -> dict:
        return {"Authorization": f"token {token or self.admin_token}"}

    async def request(
        self,
        method: str,
        path: str,
        token: str | None = None,
        anonymous: bool = False,
        headers_extra: dict | None = None,
        **kw,
    ) -> requests.Response:
        """Like ``RunningHub.gpulab``: the admin's token unless another is given
        (none at all with ``anonymous``)."""
        headers = {} if anonymous else self.auth(token)
        headers.update(headers_extra or {})
        self.watch_listening_again()
        try:
            return await asyncio.to_thread(
                requests.request,
                method,
                f"{self.api}{path}",
                headers=headers,
                timeout=kw.pop("timeout", 120),
                **kw,
            )
        except requests.Timeout:
            dump_loop_state(f"{method} {path} got no answer from {self.url}")
            raise

    async def raw(
        self,
        method: str,
        path: str,
        token: str | None,
        body: bytes,
        content_type: str = "application/json",
        **kw,
    ) -> requests.Response:
        """Send ``body`` as it is (bytes that are not JSON, not UTF-8, too many)."""
        return await self.request(
            method, path, token, data=body, headers_extra={"Content-Type": content_type}, **kw
        )


@contextlib.asynccontextmanager
async def running_service(
    data_dir: Path, config: str = "", simulate: str = "2xA100-80GB", fake_hub=None
):
    """Start the real gpulab service in this process, on a random port, with a fake hub
    API; stop both (and every task the service started) on exit.

    ``config`` is gpulab_config.py text (``c.GpuLabService.max_upload_mib = 1``...).
    ``fake_hub``: the :class:`FakeHubAPI` of an earlier service on the same data
    dir, for a restart (the hub, its users and servers outlive the service).
    """
    from jupyterhub.services.auth import HubOAuth

    from gpulab.service.app import GpuLabService

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "gpulab_config.py").write_text(config)
    hub = fake_hub or FakeHubAPI()
    hub_server, hub_port = listen(hub.make_app())
    env = {
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_port}/hub/api",
        "JUPYTERHUB_API_TOKEN": hub.service_token,
        "JUPYTERHUB_SERVICE_NAME": SERVICE_NAME,
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
    }
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    umask = os.umask(0o022)
    os.umask(umask)
    tasks_before = asyncio.all_tasks()
    server = svc = None
    try:
        cfg = Config()
        cfg.GpuLabService.data_dir = str(data_dir)
        cfg.InventorySettings.simulate_gpus = simulate
        # Route logic needs no sampling of this machine.
        cfg.TelemetrySettings.local_sampler = False
        svc = GpuLabService(config=cfg)
        svc.initialize([])
        # The hub's OAuth helper is a singleton: a fresh one for this service's hub.
        HubOAuth.clear_instance()
        app = svc.make_app()
        from gpulab.service.api.request_body import JSON_BODY_LIMIT

        server, port = listen(app, xheaders=True, max_body_size=JSON_BODY_LIMIT)
        await _start_background(svc)
        yield InProcessService(svc, hub, data_dir, port, hub_server, server)
    finally:
        if server is not None:
            server.stop()
        hub_server.stop()
        if svc is not None:
            await svc.stop()
        current = asyncio.current_task()
        leftover = [t for t in asyncio.all_tasks() - tasks_before if t is not current]
        for t in leftover:
            t.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        HubOAuth.clear_instance()
        os.umask(umask)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def _start_background(svc) -> None:
    """What the service starts once it listens: its managers' background work (the
    reconciler against the fake hub, the job queue, the deployments). ``stop()``
    ends it."""
    await svc.start_managers()
