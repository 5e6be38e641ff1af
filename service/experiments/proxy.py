"""The proxy in front of MLflow: who asks (the hub), what they may touch (their own).

Every request under ``/services/mlflow/`` is identified by the hub: the ``mlflow``
client's ``Authorization: Bearer <hub token>`` (``MLFLOW_TRACKING_TOKEN``), ``token
<hub token>``, or the browser's hub login (OAuth) for the UI. Then :mod:`.surface` says
what the request reaches and the proxy checks it against :mod:`.ownership` before
MLflow sees it: a user's experiments and runs are theirs alone (another's id answers
404, as a missing one does); searches are narrowed to the caller's experiments;
admins reach everything. A hub user's name can be given again (a user deleted, a new
one made with it): what the earlier user of the name left is not the new one's, for
the caller's own experiments are those made no earlier than their hub user (its
``created``). The gpulab service itself (a trusted service) writes jobs'
runs in their users' names (``X-Gpulab-User``), never as an admin.

The browser's requests are cross-site-checked here (``Sec-Fetch-Site``/``Origin``)
rather than with the hub's xsrf token, which MLflow's UI does not send.

Who asks is known before the body is read (the handler streams its body): a request
without a valid token is answered at its headers, and a body is held to its route's
size (an artifact upload to ``c.MlflowProxy.max_upload_mib``, a JSON call to
:data:`API_BODY_LIMIT`) in a file past its first MiB, not in the proxy's memory.

A JSON body names its fields in snake_case, as MLflow's client and UI send them: MLflow
also takes each field's camelCase name (``runId`` for ``run_id``), and an id under a
name the checks do not read would be acted on unchecked, so any other top-level key is
refused (GraphQL's body aside: :mod:`.graphql_check` reads its camelCase inputs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
from jupyterhub.services.auth import HubOAuthenticated
from tornado import web
from tornado.iostream import StreamClosedError

from gpulab.service.hub_down import HUB_DOWN, hub_unreachable

from .ownership import (
    DEFAULT_EXPERIMENT_ID,
    NotFound,
    Owners,
    is_theirs,
    namespaced,
    owner_filter,
    with_owner_tag,
)
from .surface import API_ROOTS, ARTIFACT_ROOTS, OWNER_TAG, Check, classify

log = logging.getLogger("gpulab.experiments")

#: The header the gpulab service names a job's user with (honoured for trusted services only).
ON_BEHALF_HEADER = "X-Gpulab-User"
#: Not passed on to MLflow (the hub's credentials) nor back (hop-by-hop).
DROP_REQUEST = frozenset(
    {
        "authorization",
        "cookie",
        "host",
        "content-length",
        "connection",
        "transfer-encoding",
        "origin",
        "referer",
    }
    | {ON_BEHALF_HEADER.lower()}
)
DROP_RESPONSE = frozenset(
    {"content-length", "connection", "transfer-encoding", "keep-alive", "server", "date"}
)
#: Characters a user name may not hold here: it goes into MLflow's filter strings.
UNSAFE_NAME = frozenset("'`\\\"")
#: The largest body of a JSON call of MLflow's API (a batch of metrics, a query).
API_BODY_LIMIT = 16 << 20
#: Routes whose body is a file (an artifact), up to ``c.MlflowProxy.max_upload_mib``.
UPLOAD_ROUTES = (*ARTIFACT_ROOTS, "ajax-api/2.0/mlflow/upload-artifact")
#: How much of a body is held in memory before it goes to a temporary file.
BODY_IN_MEMORY = 1 << 20
#: How far past what a route takes a refused body is still read (and dropped) so the
#: refusal reaches the caller; a body claiming more is answered at once.
DRAIN_LIMIT = 256 << 20
#: The largest answer of MLflow's the proxy reads whole to narrow it (a page of
#: experiments, get-by-name's experiment); a larger one is refused, asking for less.
NARROW_LIMIT = 16 << 20
#: A JSON body's top-level keys (MLflow's field names as its client sends them).
SNAKE_KEY = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class Caller:
    name: str
    admin: bool = False
    #: When the hub user was created (ms since the epoch): their experiments are those
    #: made since, not what an earlier user of the same name left. None: no such limit.
    since: int | None = None


def created_since(model: dict) -> int | None:
    """The hub user model's ``created`` (ISO 8601, UTC when it names no zone) in ms
    since the epoch; None without one. Refused (502) if it cannot be read."""
    created = model.get("created")
    if not created:
        return None
    try:
        when = datetime.fromisoformat(str(created))
    except ValueError:
        raise Refused(
            502, "INTERNAL_ERROR", "the hub's answer about this user could not be read"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def mlflow_error(status: int, code: str, message: str) -> dict:
    """MLflow's error shape (its client reads ``error_code`` and ``message``) with
    gpulab's ``error`` beside it."""
    return {"error_code": code, "message": message, "error": message}


def plain_path(path: str) -> bool:
    """No ``.``, ``..`` or empty segment inside (a trailing slash is fine)."""
    segments = path.strip("/").split("/")
    return path.strip("/") == "" or not any(s in ("", ".", "..") for s in segments)


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def query_args(query_arguments: dict[str, list[bytes]]) -> dict[str, list[str]]:
    """The request's query as text; Refused (400) if it is not UTF-8."""
    try:
        return {k: [v.decode() for v in vs] for k, vs in query_arguments.items()}
    except UnicodeDecodeError:
        raise Refused(400, "INVALID_PARAMETER_VALUE", "the query must be UTF-8") from None


def parse_body(raw: bytes, graphql: bool = False) -> dict:
    """A JSON call's body: one object whose top-level keys are snake_case (but for
    GraphQL's); Refused (400) otherwise. Runs off the event loop (up to 16 MiB)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        raise Refused(400, "INVALID_PARAMETER_VALUE", "the body must be JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "INVALID_PARAMETER_VALUE", "the body must be a JSON object")
    odd = [k for k in body if not SNAKE_KEY.fullmatch(k)]
    if odd and not graphql:
        raise Refused(
            400,
            "INVALID_PARAMETER_VALUE",
            f"the body's field {odd[0][:100]!r} is refused here: name MLflow's fields in "
            "snake_case (run_id, experiment_ids), as MLflow's client sends them",
        )
    return body


def encode_body(body: dict) -> bytes:
    """The body (as checked, rewritten) for MLflow; Refused (400) if it cannot be."""
    try:
        return json.dumps(body).encode()
    except (ValueError, RecursionError):
        raise Refused(400, "INVALID_PARAMETER_VALUE", "the body must be JSON") from None


def narrowed(kind: str, user: str, raw: bytes, since: int | None = None) -> tuple[int, bytes]:
    """MLflow's answer (``raw``) to a search or get-by-name, the caller's own only
    (defence in depth beside the filter): ``(status, body)``. Runs off the event loop."""
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        body = mlflow_error(502, "INTERNAL_ERROR", "MLflow's answer could not be read")
        return 502, json.dumps(body).encode()
    if kind == "search_experiments":
        data["experiments"] = [
            e for e in data.get("experiments") or [] if is_theirs(e, user, since)
        ]
    elif kind == "experiment_name" and not is_theirs(data.get("experiment") or {}, user, since):
        body = mlflow_error(404, "RESOURCE_DOES_NOT_EXIST", "no such experiment")
        return 404, json.dumps(body).encode()
    return 200, json.dumps(data).encode()


async def read_capped(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """All of ``content``, or None once it is past ``limit`` bytes (the rest unread)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class MlflowBackend:
    """HTTP to MLflow's server over its Unix socket (started on first use)."""

    def __init__(self, tracking, prefix: str):
        self.tracking = tracking
        self.prefix = "/" + prefix.strip("/")
        self._session: aiohttp.ClientSession | None = None

    async def session(self) -> aiohttp.ClientSession:
        socket_path = await self.tracking.ready()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=socket_path),
                # Bodies pass through as MLflow wrote them (its gzip included).
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600),
            )
        return self._session

    def url(self, path: str) -> str:
        """``path`` (decoded, checked) quoted again: ``%2F`` and ``?`` in a name stay
        part of it, never a folder or a query of MLflow's."""
        return f"http://localhost{self.prefix}/{quote(path.lstrip('/'), safe='/')}"

    async def call(self, method: str, route: str, args: dict | None, body: dict | None):
        """One JSON call of MLflow's API (``route`` below ``api/2.0/mlflow/``)."""
        session = await self.session()
        query = urlencode([(k, v) for k, vs in (args or {}).items() for v in vs])
        url = self.url(f"{API_ROOTS[0]}{route}") + (f"?{query}" if query else "")
        async with session.request(
            method, url, json=body, headers={"Host": "localhost", "Accept-Encoding": "identity"}
        ) as resp:
            data = await resp.read()
            try:
                return resp.status, json.loads(data or b"{}")
            except ValueError:
                return resp.status, {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@web.stream_request_body
class ProxyHandler(HubOAuthenticated, web.RequestHandler):
    """Every path under the prefix: identify (at the headers), take the body, check,
    pass on, narrow the answer."""

    caller: Caller | None = None
    #: Why this request is refused (see _judge), or None.
    refusal = None
    body_file = None
    body_size = 0

    @property
    def proxy(self):
        return self.settings["mlflow_proxy"]

    def check_xsrf_cookie(self):
        """A browser's request with the hub cookie must come from this origin."""
        site = self.request.headers.get("Sec-Fetch-Site", "")
        if site in ("same-origin", "none"):
            return
        origin = self.request.headers.get("Origin", "")
        if origin and urlsplit(origin).netloc == self.request.host:
            return
        raise web.HTTPError(403, "a cross-site request with the hub's cookie is refused")

    def _error(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(mlflow_error(status, code, message)))

    async def _identify(self) -> Caller | None:
        try:
            model = await self.hub_auth.get_user(self, sync=False)
        except Exception as e:
            if hub_unreachable(e):
                raise Refused(503, "TEMPORARILY_UNAVAILABLE", HUB_DOWN) from None
            raise
        if not model:
            return None
        if not self.hub_auth.check_scopes(self.hub_scopes, model):
            raise Refused(
                403,
                "PERMISSION_DENIED",
                f"{model.get('kind', 'user')} {model.get('name')} may not use MLflow here: "
                f"the token lacks the scope access:services!service={self.proxy.service_name}",
            )
        if model.get("kind") == "service":
            on_behalf = self.request.headers.get(ON_BEHALF_HEADER, "")
            if model["name"] not in self.proxy.trusted_services or not on_behalf:
                raise Refused(
                    403, "PERMISSION_DENIED", f"service {model['name']} may not use MLflow here"
                )
            # The runs of a user's job are theirs only if that user is the one now.
            return Caller(on_behalf, since=created_since(await self._hub_user(on_behalf)))
        user = await self._hub_user(model["name"])
        return Caller(model["name"], admin=bool(user.get("admin")), since=created_since(user))

    async def _hub_user(self, name: str) -> dict:
        """The hub's model of user ``name`` ({} for none)."""
        try:
            return await self.proxy.hub.user(name) or {}
        except Exception as e:
            if hub_unreachable(e):
                raise Refused(503, "TEMPORARILY_UNAVAILABLE", HUB_DOWN) from None
            raise

    async def prepare(self):
        """Who asks and whether the path and body size can be taken, before any of
        the body is read. A refused request's body is read and dropped, then answered
        (closing a connection with its body unread makes the hub's proxy answer its
        own 503, for that request or the next on the connection); one claiming more
        than DRAIN_LIMIT past what is taken is answered at once."""
        path = self.path_args[0] if self.path_args else ""
        self.refusal = refusal = await self._judge(path)
        upload = path.startswith(UPLOAD_ROUTES)
        limit = self.proxy.max_upload_mib << 20 if upload else API_BODY_LIMIT
        sent = self.request.headers.get("Content-Length", "")
        size = int(sent) if sent.isdigit() else None
        if refusal is None and size is not None and size > limit:
            what = "an artifact" if upload else "a call of MLflow's API"
            fix = "an admin can raise c.MlflowProxy.max_upload_mib" if upload else "send less"
            self.refusal = refusal = (
                413,
                "REQUEST_LIMIT_EXCEEDED",
                f"the body ({size / 2**20:.1f} MiB) is over the {limit / 2**20:.0f} MiB "
                f"{what} may send here; {fix}",
            )
        if refusal is not None:
            most = (0 if refusal[0] == 413 else limit) + DRAIN_LIMIT
            if size is not None and size > most:
                return self._refuse()  # too much to read for nothing: hung up on
            self.request.connection.set_max_body_size(size if size is not None else most)
            return
        self.request.connection.set_max_body_size(limit)  # a chunked body, too
        # Closed in on_finish (or by the collector, for a caller who left mid-way).
        self.body_file = tempfile.SpooledTemporaryFile(max_size=BODY_IN_MEMORY)  # noqa: SIM115

    async def _judge(self, path: str):
        """None if the caller may send this request, else how it is refused:
        ``(status, code, message)``, or ``"login"`` (a person opening the UI)."""
        try:
            self.caller = caller = await self._identify()
        except Refused as e:
            return (e.status, e.code, e.message)
        if caller is None:
            api = path.startswith(("api/", "ajax-api/")) or self.request.method != "GET"
            if not api:  # a person opening the UI: the hub's login, then back here
                return "login"
            return (
                401,
                "UNAUTHENTICATED",
                "authentication required: set MLFLOW_TRACKING_TOKEN to a JupyterHub API "
                "token (the hub's token page) or log in to the hub",
            )
        if any(c in UNSAFE_NAME for c in caller.name):
            return (403, "PERMISSION_DENIED", "this user name cannot use MLflow here")
        if not plain_path(path):
            # The client library normalizes "1/../2" to "2" before MLflow sees it: what
            # was checked would not be what is reached.
            return (400, "INVALID_PARAMETER_VALUE", "a path with '.', '..' or '//' is refused")
        return None

    def _refuse(self) -> None:
        if self.refusal == "login":
            return self.redirect(self.get_login_url())
        return self._error(*self.refusal)

    def data_received(self, chunk: bytes) -> None:
        if self.refusal is not None:
            return  # dropped: the answer is a refusal
        self.body_file.write(chunk)
        self.body_size += len(chunk)

    def on_finish(self) -> None:
        if self.body_file is not None:
            self.body_file.close()

    async def get(self, path):
        if self.refusal is not None:
            return self._refuse()
        await self._handle(path)

    post = put = patch = delete = head = get

    async def _handle(self, path: str) -> None:
        caller = self.caller
        body = {}
        self.body_file.seek(0)
        raw = self.body_file if self.body_size else b""
        # An upload's body is the file (the UI's upload-artifact is under the API's
        # root): streamed on as it came, never read whole or parsed.
        is_api = (
            (path.startswith(API_ROOTS) or path == "graphql")
            and not path.startswith(UPLOAD_ROUTES)
            and self.request.method in ("POST", "PUT", "PATCH", "DELETE")
        )
        try:
            args = query_args(self.request.query_arguments)
            if is_api and self.body_size:
                raw = self.body_file.read()  # at most API_BODY_LIMIT
                body = await asyncio.to_thread(parse_body, raw, path == "graphql")
            check = classify(self.request.method, path, args, body)
            if not caller.admin:
                await self._enforce(check, caller.name, args, body, caller.since)
            if body and is_api:
                raw = await asyncio.to_thread(encode_body, body)
        except Refused as e:
            return self._error(e.status, e.code, e.message)
        except NotFound as e:
            return self._error(404, "RESOURCE_DOES_NOT_EXIST", f"no experiment or run {e} of yours")
        await self._pass_on(path, args, raw, check, caller)

    async def _enforce(
        self, check: Check, user: str, args: dict, body: dict, since: int | None = None
    ) -> None:
        owners: Owners = self.proxy.owners
        kind = check.kind
        if kind == "open":
            return
        if kind == "refuse":
            raise Refused(403, "PERMISSION_DENIED", check.why)
        if kind == "create_experiment":
            # (artifactLocation: camelCase is refused before; by name too, for its weight)
            if body.get("artifact_location") or "artifactLocation" in body:
                raise Refused(
                    400,
                    "INVALID_PARAMETER_VALUE",
                    "artifact_location is set by gpulab: create the experiment without it",
                )
            body["name"] = namespaced(user, str(body.get("name") or ""))
            body["tags"] = with_owner_tag(body.get("tags"), user)
            await self._make_way(user, body["name"], since)
        elif kind == "search_experiments":
            if self.request.method == "GET":
                args["filter"] = [owner_filter(user, (args.get("filter") or [""])[0], since)]
            else:
                body["filter"] = owner_filter(user, str(body.get("filter") or ""), since)
        elif kind == "experiment_name":
            args["experiment_name"] = [namespaced(user, check.name)]
        elif kind == "create_run":
            wanted = check.experiments[0] if check.experiments else DEFAULT_EXPERIMENT_ID
            if wanted == DEFAULT_EXPERIMENT_ID:
                wanted = await owners.default_experiment(user, since)
            else:
                await owners.check_experiments(user, [wanted], since)
            # Always in the body, which MLflow reads: the experiment checked is the one used.
            body["experiment_id"] = wanted
        elif kind in ("experiments", "artifact"):
            await owners.check_experiments(user, check.experiments, since)
            tagging = check.route.endswith(("set-experiment-tag", "delete-experiment-tag"))
            if tagging and body.get("key") == OWNER_TAG:
                raise Refused(403, "PERMISSION_DENIED", f"the tag {OWNER_TAG} is gpulab's")
            if check.route.endswith("experiments/update") and body.get("new_name"):
                body["new_name"] = namespaced(user, str(body["new_name"]))
                await self._make_way(user, body["new_name"], since)
        elif kind == "runs":
            await owners.check_runs(user, check.runs, since)
        elif kind == "graphql":
            await owners.check_experiments(user, check.experiments, since)
            await owners.check_runs(user, check.runs, since)
        else:  # a kind this proxy does not know is never let through
            raise Refused(403, "PERMISSION_DENIED", "not offered")

    async def _make_way(self, user: str, name: str, since: int | None) -> None:
        """An experiment ``name`` left by an earlier hub user of the caller's name is
        renamed aside (:meth:`.Owners.set_aside`); Refused (409) if it cannot be."""
        if not await self.proxy.owners.set_aside(user, name, since):
            raise Refused(
                409,
                "RESOURCE_ALREADY_EXISTS",
                f"an experiment {name!r} is left from an earlier hub user named {user!r}: "
                "pick another name",
            )

    async def _pass_on(self, path: str, args: dict, raw, check: Check, caller: Caller):
        """``raw``: the body, bytes or the file it was kept in (sent as it is read)."""
        backend: MlflowBackend = self.proxy.backend
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in DROP_REQUEST}
        headers["Host"] = "localhost"
        if self.request.method not in ("GET", "HEAD"):
            # Said, so a body from a file is not sent chunked.
            size = len(raw) if isinstance(raw, bytes) else self.body_size
            headers["Content-Length"] = str(size)
        query = urlencode([(k, v) for k, vs in args.items() for v in vs])
        url = backend.url(path) + (f"?{query}" if query else "")
        # Answers the proxy narrows are read whole (plain JSON, a page of results).
        narrow = not caller.admin and check.kind in ("search_experiments", "experiment_name")
        if narrow:
            headers["Accept-Encoding"] = "identity"
        try:
            session = await backend.session()
            async with session.request(
                self.request.method,
                url,
                data=raw if self.request.method not in ("GET", "HEAD") else None,
                headers=headers,
                allow_redirects=False,
            ) as resp:
                self.set_status(resp.status, resp.reason)
                for key, value in resp.headers.items():
                    if key.lower() == "set-cookie":
                        self.add_header(key, value)
                    elif key.lower() not in DROP_RESPONSE:
                        self.set_header(key, value)
                if narrow and resp.status == 200:
                    data = await read_capped(resp.content, NARROW_LIMIT)
                    if data is None:
                        self.clear()
                        return self._error(
                            400,
                            "INVALID_PARAMETER_VALUE",
                            f"MLflow's answer is over the {NARROW_LIMIT >> 20} MiB this proxy "
                            "reads to narrow it: ask for less (a smaller max_results, a "
                            "narrower filter)",
                        )
                    status, out = await asyncio.to_thread(
                        narrowed, check.kind, caller.name, data, caller.since
                    )
                    self.set_status(status)
                    self.clear_header("Content-Encoding")
                    return self.finish(out)
                async for chunk in resp.content.iter_chunked(1 << 16):
                    self.write(chunk)
                    await self.flush()
        except StreamClosedError:
            return  # the caller left (a browser tab closed): nothing to answer
        except (aiohttp.ClientError, OSError, RuntimeError, TimeoutError) as e:
            log.warning("MLflow's server did not answer %s %s: %s", self.request.method, path, e)
            if not self._headers_written:
                self.clear()
                return self._error(
                    503,
                    "TEMPORARILY_UNAVAILABLE",
                    "MLflow's server is not answering; retry shortly",
                )
        self.finish()
