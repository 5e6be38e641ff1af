"""The endpoint router: the fast front door of every endpoint, behind the hub's proxy.

Endpoint calls are many and small; the service's Tornado routes cost about a
millisecond of CPU each (routing, the handler machinery, the access log). The
router is a bare aiohttp server in the same process that does only what a call
needs: check the caller's hub token (answers cached for ``TOKEN_TTL_S``, 5 s, and
asked again in the background before they expire while the token is in use), check
the caller may use the endpoint (owner, admins, shared users and groups), and
hand the call to :meth:`~gpulab.service.endpoints.calls.CallsMixin.call`.

The hub's configurable-http-proxy sends it the calls: at start the router adds a
route for ``<prefix>endpoints`` (a longer prefix than the service's own route)
through the proxy's REST API, keeps it there (the proxy may restart), and takes
it away when the service stops, so calls fall back to the service's own
endpoint route. Calls without a token (a browser's hub cookie) go to that route
too. Without ``c.Endpoints.proxy_api_url`` (and ``CONFIGPROXY_AUTH_TOKEN``)
there is no router; the service's route answers every call.

The OpenAI-compatible gateway (:mod:`.openai_gateway`) comes in the same way: a
second route, ``<prefix>v1``, to this router, whose answers stream event by event
(the service's own ``v1`` routes answer where there is no router, and the standby
hands them to the service, which answers 503 while it restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from gpulab.enforcement.peer_account import refuse_foreign_listener
from gpulab.service import tls
from gpulab.service.auth import TOKEN_CACHE_S, Identity
from gpulab.service.endpoints import openai_gateway
from gpulab.service.endpoints.call_bytes import Held, NoRoom
from gpulab.service.endpoints.calls import MAX_CALL_MIB, CallRefused
from gpulab.service.endpoints.openai_errors import error_body
from gpulab.service.endpoints.openai_gateway import MAX_CALL_BYTES, body_limit
from gpulab.service.hub_down import HUB_DOWN, hub_unreachable
from gpulab.service.tasks import KeptTask

log = logging.getLogger("gpulab.service.endpoints.router")

#: How long a token's answer (who, or invalid) is reused: a revoked token stops
#: working here within this (the service's read cache, :data:`.auth.TOKEN_CACHE_S`).
TOKEN_TTL_S = float(TOKEN_CACHE_S)
BAD_TOKEN_TTL_S = 10.0
TOKEN_CACHE_SIZE = 10_000
#: A token used in the last KEEP_WARM_S has its answer asked of the hub again in the
#: background shortly before it expires (REFRESH_AHEAD_S), so a client that pauses
#: (a chat between two turns, a benchmark between rounds) does not find it expired
#: and make its next burst of calls wait for the hub's round trip (traced: 15 to 60
#: ms of a 16-call burst's time to first token through the gateway). Each answer is
#: still at most TOKEN_TTL_S old: a revoked token stops working as soon as before.
KEEP_WARM_S = 60.0
REFRESH_AHEAD_S = 2.0
#: How often the keeper looks for answers about to expire, and the most tokens one
#: look asks about (the most recently used first): the hub's load stays bounded.
REFRESH_EVERY_S = 1.0
MAX_KEPT_WARM = 256
#: How often the proxy's route table is checked for ours.
ROUTE_CHECK_S = 15.0
#: Request and response headers an OIP v2 exchange needs; nothing else crosses.
FORWARD_REQUEST = (
    "Content-Type",
    "Content-Encoding",
    "Accept-Encoding",
    "Inference-Header-Content-Length",
)
FORWARD_RESPONSE = ("Content-Type", "Content-Encoding", "Inference-Header-Content-Length")
#: What an endpoint's answer may say it is: OIP v2's JSON and binary tensors, text,
#: streamed events. Any other type (``text/html``, ``image/svg+xml``) would be a page
#: the replica's owner wrote, run on the hub's origin as whoever opened the URL (an
#: admin may call every endpoint): it goes as ``application/octet-stream``.
ANSWER_TYPES = frozenset(
    {"application/json", "application/octet-stream", "text/plain", "text/event-stream"}
)
#: Said on every endpoint answer: no type guessed from its bytes, nothing in it run.
ANSWER_GUARDS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


def answer_headers(headers) -> dict:
    """The headers of a replica's answer that reach the caller."""
    out = {h: headers[h] for h in FORWARD_RESPONSE if h in headers}
    kind = out.get("Content-Type", "").split(";")[0].strip().lower()
    if kind not in ANSWER_TYPES:
        out["Content-Type"] = "application/octet-stream"
    return {**out, **ANSWER_GUARDS}


def forwarded_headers(headers) -> dict:
    return {h: headers[h] for h in FORWARD_REQUEST if h in headers}


class Denied(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class TokenCache:
    """token -> (identity or None, expiry), bounded; and when each token was last used
    (what :meth:`due` keeps warm)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._answers: dict[str, tuple[object, float]] = {}
        self._used: dict[str, float] = {}

    def get(self, token: str):
        hit = self._answers.get(token)
        now = self.clock()
        if hit is None or hit[1] < now:
            return None, False
        self._used[token] = now
        return hit[0], True

    def due(self) -> list[str]:
        """Tokens to ask about again now: a valid answer that expires within
        REFRESH_AHEAD_S, for a token used in the last KEEP_WARM_S; the most recently
        used first, MAX_KEPT_WARM at most. Refusals are not kept warm."""
        now = self.clock()
        idle = [t for t, at in self._used.items() if at < now - KEEP_WARM_S]
        for token in idle:
            del self._used[token]
        due = []
        for token, at in self._used.items():
            hit = self._answers.get(token)
            if hit is None or hit[1] < now:
                continue  # expired or forgotten: the next call asks
            who, expires = hit
            valid = who is not None and not isinstance(who, Exception)
            if valid and expires - now < REFRESH_AHEAD_S:
                due.append((at, token))
        due.sort(reverse=True)
        return [t for _, t in due[:MAX_KEPT_WARM]]

    def put(self, token: str, identity) -> None:
        if len(self._answers) >= TOKEN_CACHE_SIZE:
            now = self.clock()
            self._answers = {t: a for t, a in self._answers.items() if a[1] >= now}
            if len(self._answers) >= TOKEN_CACHE_SIZE:
                self._answers.clear()
            self._used = {t: at for t, at in self._used.items() if t in self._answers}
        ttl = TOKEN_TTL_S if identity is not None else BAD_TOKEN_TTL_S
        self._answers[token] = (identity, self.clock() + ttl)
        self._used.setdefault(token, self.clock())

    def forget(self, name: str) -> None:
        """Drop the answers for ``name``'s tokens (one was revoked at the hub)."""
        self._answers = {
            t: a for t, a in self._answers.items() if getattr(a[0], "name", None) != name
        }
        self._used = {t: at for t, at in self._used.items() if t in self._answers}


def error(status: int, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if status == 405:
        headers["Allow"] = "GET, HEAD, POST"
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode(),
        content_type="application/json",
        headers=headers,
    )


class AiohttpReply:
    """A :class:`~gpulab.service.endpoints.openai_gateway.Reply` on an aiohttp request."""

    def __init__(self, request: web.BaseRequest):
        self.request = request
        self.response: web.StreamResponse | None = None
        self.started = False

    async def start(self, status: int, headers: dict[str, str]) -> None:
        self.started = True
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        try:
            await asyncio.wait_for(self.response.write(data), openai_gateway.WRITE_TIMEOUT_S)
        except TimeoutError:
            self.request.transport.close()  # a caller that does not read: gone
            raise ConnectionResetError("the caller read nothing for a minute") from None

    async def finish(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response


@dataclass(frozen=True)
class RouterAddress:
    """Where the service's router listens and how the proxy is told of it (the
    ``c.Endpoints`` settings ``proxy_api_url`` and ``endpoint_router_*``)."""

    proxy_api_url: str
    ip: str
    port: int
    url: str = ""  # where the proxy reaches the router; "": http://ip:port


def changes_state(method: str, path: str) -> bool:
    """A gateway call that changes something (an upload, a fine-tuning job, a cancel, a
    delete): its token is asked of the hub, never a cached answer, as the service's own
    routes do. Generation and embeddings only read."""
    return method not in ("GET", "HEAD") and path.lstrip("/").startswith(("files", "fine_tuning"))


def call_limit(max_upload_mib: int) -> int:
    """The most bytes an endpoint call's body may have: what a replica takes, or less
    where ``c.GpuLabService.max_upload_mib`` is lower."""
    return min(max_upload_mib, MAX_CALL_MIB) << 20


def call_too_large(max_upload_mib: int) -> str:
    mib = call_limit(max_upload_mib) >> 20
    if mib < MAX_CALL_MIB:
        return (
            f"the request is larger than {mib} MiB; an admin can raise "
            f"c.GpuLabService.max_upload_mib"
        )
    return f"the request is larger than {mib} MiB, the most a model server takes; send fewer rows"


async def read_at_most(request: web.BaseRequest, limit: int, held: Held | None = None) -> bytes:
    """The body, refused (413) once it is over ``limit`` bytes: a chunked body says its
    size only as it comes. ``held``: where its bytes are counted as they come (a
    :class:`~.call_bytes.NoRoom` past the caller's share)."""
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise Denied(413, f"the request is larger than {limit >> 20} MiB; send less")
        if held is not None:
            held.add(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


#: An answer goes to the caller a slice at a time, each waited for (WRITE_TIMEOUT_S):
#: the transport's buffer never holds a copy of a large answer.
WRITE_SLICE = 1 << 20


async def send_answer(
    request: web.BaseRequest, status: int, reason: str | None, headers: dict, data
) -> web.StreamResponse:
    """Write ``data`` (bytes or a bytearray) as the answer, a slice at a time; a caller
    that reads nothing for ``WRITE_TIMEOUT_S`` is hung up on, so its answer is not held
    in memory for as long as it likes."""
    response = web.StreamResponse(status=status, reason=reason, headers=headers)
    body = request.method != "HEAD" and status not in (204, 304) and status >= 200
    response.content_length = len(data) if body else None
    if not body:
        response.headers.pop("Content-Length", None)
    try:
        await asyncio.wait_for(response.prepare(request), openai_gateway.WRITE_TIMEOUT_S)
        if body:
            view = memoryview(data)
            for at in range(0, len(view), WRITE_SLICE):
                await asyncio.wait_for(
                    response.write(view[at : at + WRITE_SLICE]), openai_gateway.WRITE_TIMEOUT_S
                )
        await asyncio.wait_for(response.write_eof(), openai_gateway.WRITE_TIMEOUT_S)
    except TimeoutError:
        if request.transport is not None:
            request.transport.close()  # a caller that does not read: gone
        log.info("endpoint call %s: the caller read nothing for a minute", request.path)
    except ConnectionResetError:
        pass  # the caller went away
    return response


class EndpointRouter:
    """Answers endpoint calls under ``<prefix>endpoints/`` through ``calls`` (an
    :class:`~gpulab.service.endpoints.calls.EndpointCalls`); ``identify`` says who a
    caller's hub token is. ``address``: where it listens (None: it does not listen
    itself; the standby hands it a socket)."""

    def __init__(
        self,
        calls,
        *,
        prefix: str,
        max_upload_mib: int,
        identify: Callable[[dict], Awaitable[Identity]],
        address: RouterAddress | None = None,
        hub_auth=None,
        gateway=None,
    ):
        self.calls = calls
        self.max_upload_mib = max_upload_mib
        self.identify = identify
        self.address = address
        self.hub_auth = hub_auth
        self.tokens = TokenCache()
        self._lookups: dict[str, asyncio.Future] = {}  # tokens being asked of the hub now
        self.prefix = prefix.rstrip("/") + "/endpoints/"
        #: The OpenAI-compatible gateway under ``<prefix>v1/`` (:mod:`.openai_gateway`);
        #: None (the standby): its calls go to the service's route.
        self.gateway = gateway
        self.v1 = prefix.rstrip("/") + "/v1/"
        self.url: str | None = None  # where the proxy reaches the router
        self.socket = None  # the one it listens on (a standby takes it over: endpoints/standby.py)
        self._runner: web.ServerRunner | None = None
        self._keeper = KeptTask("gpulab-endpoint-route", self._keep_route)
        self._warm = KeptTask("gpulab-router-tokens", self._keep_tokens_warm)
        self._session: aiohttp.ClientSession | None = None

    # -- running -----------------------------------------------------------------------
    async def start(self) -> None:
        api = self.address.proxy_api_url if self.address is not None else ""
        if not api or not os.environ.get("CONFIGPROXY_AUTH_TOKEN"):
            log.info("No proxy API (c.Endpoints.proxy_api_url): endpoints via the service")
            return
        if self.hub_auth is None:
            from jupyterhub.services.auth import HubOAuth

            self.hub_auth = HubOAuth.instance()  # the one the service's routes use
        limit = self.max_upload_mib * 2**20
        server = web.Server(self.handle, client_max_size=limit)
        self._runner = web.ServerRunner(server, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.address.ip, self.address.port, ssl_context=tls.server_context()
        )
        await site.start()
        self.socket = site._server.sockets[0]
        port = self.socket.getsockname()[1]  # the port the system chose
        self.url = self.address.url or f"{tls.scheme()}://{self.address.ip}:{port}"
        self._session = self.new_session()
        await self._keep_route_once()
        self._keeper.start()
        self._warm.start()
        log.info("Endpoint router on %s, routed from %s", self.url, self.prefix)

    async def stop(self) -> None:
        await self._keeper.stop()
        await self._warm.stop()
        if self._session is not None:
            for spec in self._routespecs():
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    # Calls fall back to the service's route.
                    await self._proxy_api("DELETE", spec=spec)
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @staticmethod
    def new_session() -> aiohttp.ClientSession:
        """For the proxy's API and the service's own route: under internal_ssl both are
        https, and the proxy's API asks for the service's certificate."""
        connector = aiohttp.TCPConnector(
            ssl=tls.platform_client_context() if tls.serves_tls() else None
        )
        return aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
        )

    # -- the proxy's route -------------------------------------------------------------
    def _routespec(self) -> str:
        return self.prefix.rstrip("/")

    def _routespecs(self) -> list[str]:
        """The proxy's routes to this router: the endpoints, and the gateway's."""
        return [self._routespec()] + ([self.v1.rstrip("/")] if self.gateway is not None else [])

    async def _proxy_api(self, method: str, body: dict | None = None, spec: str | None = None):
        spec = spec or self._routespec()
        url = f"{self.address.proxy_api_url.rstrip('/')}/api/routes{spec}"
        # The proxy's token (which routes /hub/ too) never goes to a port of this
        # machine that another account took while the proxy was down.
        await refuse_foreign_listener(url, "the proxy's API")
        headers = {"Authorization": f"token {os.environ['CONFIGPROXY_AUTH_TOKEN']}"}
        async with self._session.request(
            method, url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            return resp.status, await resp.read()

    async def _keep_route_once(self) -> None:
        for spec in self._routespecs():
            try:
                status, data = await self._proxy_api("GET", spec=spec)
                route = json.loads(data) if status == 200 and data.strip() else None
                if not route or route.get("target") != self.url:
                    status, data = await self._proxy_api(
                        "POST", {"target": self.url, "gpulab": True}, spec=spec
                    )
                    if status >= 300:
                        log.warning(
                            "The proxy refused the route %s: %s %s", spec, status, data[:200]
                        )
                    else:
                        log.info("Proxy route %s -> %s", spec, self.url)
            except (aiohttp.ClientError, OSError, ValueError) as e:
                log.warning("Cannot reach the proxy API to route endpoints: %s", e)

    async def _keep_route(self) -> None:
        while True:
            await asyncio.sleep(ROUTE_CHECK_S)
            await self._keep_route_once()

    # -- calls -------------------------------------------------------------------------
    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except Denied as e:
            return error(e.status, str(e))
        except (CallRefused, NoRoom) as e:
            return error(e.status, str(e), e.retry_after)
        except web.HTTPRequestEntityTooLarge:
            return self._too_large()
        except Exception:
            log.exception("endpoint call %s", request.path)
            return error(500, "internal error in the gpulab service; see its log")

    def _too_large(self) -> web.Response:
        return error(413, call_too_large(self.max_upload_mib))

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token.strip():
            return await self._via_service(request)  # a browser's cookie, or nothing
        raw = request.raw_path
        path, _, query = raw.partition("?")
        if path.startswith(self.v1):
            if self.gateway is None:
                return await self._via_service(request)
            return await self._openai(request, token.strip(), path[len(self.v1) :])
        if not path.startswith(self.prefix):
            raise Denied(404, "not an endpoint path")
        parts = path[len(self.prefix) :].split("/", 2)
        if len(parts) < 3:
            raise Denied(404, "call <hub>/services/gpulab/endpoints/<owner>/<name>/v2/...")
        try:
            user, name = unquote(parts[0], errors="strict"), unquote(parts[1], errors="strict")
        except UnicodeDecodeError:
            raise Denied(400, "the owner or name in the URL is not UTF-8") from None
        if "\x00" in user + name + parts[2]:
            raise Denied(400, "the URL path holds a NUL byte (%00)")
        if request.method not in ("GET", "POST", "HEAD"):
            raise Denied(405, f"endpoints answer GET, HEAD and POST, not {request.method}")
        who = await self._identify(token.strip())
        dep = self.calls.callable_endpoint(who, user, name)
        limit = call_limit(self.max_upload_mib)
        length = request.content_length
        if length is not None and length > limit:
            return self._too_large()
        # The body, from before it is read, and the answer, until it is written, count
        # against the caller's bytes in memory (a 429 past them).
        held = self.calls.hold(who)
        try:
            if request.method == "POST" and length is not None:
                held.add(length)  # refused before a byte of it is read
            body = (
                await read_at_most(request, limit, held if length is None else None)
                if request.method == "POST"
                else None
            )
            status, reason, headers, data = await self.calls.call(
                dep,
                request.method,
                parts[2] + (f"?{query}" if query else ""),
                forwarded_headers(request.headers),
                body,
                who=who,
                held=held,
            )
            if body is not None:
                held.drop(len(body))  # answered: only the answer is held while it is written
                del body
            out = answer_headers(headers)
            out["Cache-Control"] = "no-store"
            return await send_answer(request, status, reason, out, data)
        finally:
            held.release()

    async def _openai(self, request: web.BaseRequest, token: str, path: str):
        """A call to the OpenAI gateway: refusals in OpenAI's shape, the answer streamed."""
        # Judged as the gateway will read it: "%66iles" is "files", a call that changes
        # state (whose token the hub is asked about afresh).
        path = unquote(path)
        try:
            if "\x00" in path:
                raise Denied(400, "the URL path holds a NUL byte (%00)")
            who = await self._identify(token, fresh=changes_state(request.method, path))
            limit = body_limit(request.method, path, self.max_upload_mib)
            length = request.content_length
            if length is not None and length > limit:
                fix = (
                    "an admin can raise c.GpuLabService.max_upload_mib"
                    if limit > MAX_CALL_BYTES
                    else "send less"
                )
                raise Denied(413, f"the request is larger than {limit >> 20} MiB; {fix}")
            body = await read_at_most(request, limit) if request.method == "POST" else None
        except Denied as e:
            return web.Response(
                status=e.status,
                body=error_body(e.status, str(e)),
                content_type="application/json",
                headers={"Cache-Control": "no-store"},
            )
        reply = AiohttpReply(request)
        try:
            await self.gateway.answer(
                who,
                request.method,
                path,
                body,
                reply,
                content_type=request.headers.get("Content-Type", ""),
                query=request.query_string,
            )
            return await reply.finish()
        except ConnectionResetError:  # the caller went away (its slot is free again)
            return reply.response

    async def _identify(self, token: str, fresh: bool = False):
        """Who ``token`` is: the cached answer (up to TOKEN_TTL_S old), or with
        ``fresh`` (a call that changes something) the hub's answer now."""
        who, known = self.tokens.get(token) if not fresh else (None, False)
        if known:
            if who is None:
                raise Denied(401, "invalid token: create one on the hub's token page")
            if isinstance(who, Denied):
                raise who
            return who
        # Calls with one token arrive together (a client's connections, all at the moment
        # its cached answer expires): one asks the hub, the others wait for its answer.
        return await asyncio.shield(self._lookup(token))

    def _lookup(self, token: str) -> asyncio.Future:
        """The hub's answer for ``token`` being asked now, or a new question."""
        pending = self._lookups.get(token)
        if pending is None:
            pending = self._lookups[token] = asyncio.ensure_future(self._ask_hub(token))
            pending.add_done_callback(lambda done: self._forget_lookup(token, done))
        return pending

    async def refresh_tokens(self) -> int:
        """Ask the hub again about the tokens :meth:`TokenCache.due` names (each
        answer replaces the cached one, a refusal included); how many were asked. A
        hub that does not answer leaves the old answer to expire as it would."""
        due = self.tokens.due()
        if due:
            await asyncio.gather(*(self._lookup(t) for t in due), return_exceptions=True)
        return len(due)

    async def _keep_tokens_warm(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY_S)
            try:
                await self.refresh_tokens()
            except Exception:  # noqa: BLE001 - the next look tries again
                log.exception("keeping the router's token answers warm")

    def _forget_lookup(self, token: str, done: asyncio.Future) -> None:
        self._lookups.pop(token, None)
        if not done.cancelled():
            done.exception()  # seen: its waiters may all have gone (cancelled calls)

    async def _ask_hub(self, token: str):
        try:
            return await self._ask_hub_once(token)
        except Exception as e:
            if hub_unreachable(e):  # not kept: the next call asks again
                raise Denied(503, HUB_DOWN) from None
            raise

    async def _ask_hub_once(self, token: str):
        # The hub itself, not HubOAuth's cache: this cache is the only one, so a
        # revoked token is refused within TOKEN_TTL_S.
        model = await self.hub_auth.user_for_token(token, use_cache=False, sync=False)
        if not model:
            self.tokens.put(token, None)
            raise Denied(401, "invalid token: create one on the hub's token page")
        if not self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
            denied = Denied(
                403,
                f"{model.get('kind', 'user')} {model.get('name')} may not use the gpulab "
                f"service: the token lacks the scope access:services!service=gpulab",
            )
            self.tokens.put(token, denied)
            raise denied
        who = await self.identify(model)
        self.tokens.put(token, who)
        return who

    async def _via_service(self, request: web.BaseRequest) -> web.StreamResponse:
        """Hand the call as it is to the service's own endpoint route (cookie logins,
        and the 401 for no credentials)."""
        base = os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101").rstrip("/")
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding", "connection")
        }
        # Streamed as it comes: the service reads a body only from a caller it knows
        # (a hub cookie), and drops a stranger's.
        body = request.content.iter_chunked(1 << 16) if request.method == "POST" else None
        async with self._session.request(
            request.method, base + request.raw_path, headers=headers, data=body
        ) as resp:
            out = {
                k: v
                for k, v in resp.headers.items()
                if k.lower()
                not in ("content-length", "transfer-encoding", "connection", "server", "date")
            }
            # Passed on as it comes (the service holds the answer, counted, until it is
            # read here), each piece waited for: never held whole a second time.
            response = web.StreamResponse(status=resp.status, reason=resp.reason, headers=out)
            if resp.content_length is not None:
                response.content_length = resp.content_length
            try:
                await asyncio.wait_for(response.prepare(request), openai_gateway.WRITE_TIMEOUT_S)
                async for chunk in resp.content.iter_chunked(1 << 16):
                    await asyncio.wait_for(response.write(chunk), openai_gateway.WRITE_TIMEOUT_S)
                await asyncio.wait_for(response.write_eof(), openai_gateway.WRITE_TIMEOUT_S)
            except TimeoutError:
                if request.transport is not None:
                    request.transport.close()  # a caller that does not read: gone
            except (ConnectionResetError, aiohttp.ClientPayloadError):
                if request.transport is not None:
                    request.transport.close()  # the caller, or the service, went away
            return response
