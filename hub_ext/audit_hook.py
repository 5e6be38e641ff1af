"""The hub's part of the audit trail: logins, server starts and stops, admin actions.

Only the hub knows who did these, so its request log does the recording:
:func:`log_request` replaces JupyterHub's ``log_function`` (it still calls
JupyterHub's own ``log_request`` first). Once a request has finished it sees the
handler's user, the method, the path and the status; a request that changed
something becomes one entry (``c.JupyterHub.tornado_settings["log_function"]``,
set by :func:`configure_audit`).

Exactly once per action:

- a login is the ``POST /hub/login`` that logged someone in (3xx) or refused them
  (403), or an OAuthenticator's ``GET /hub/oauth_callback``; the redirects that
  follow are other requests and are not counted;
- a page whose status cannot tell what happened (NativeAuthenticator's sign-up and
  password pages answer 200 whether they worked or not) says it itself: its handler
  calls :func:`note` and that is the request's entry (``user.signup``,
  ``password.change``, ``login`` with the reason it was refused, ``user.authorize``
  with the new state, ``user.discard``, ``logout``);
- a server start is the request during which the server's start began (its
  ``started`` time falls within the request): ``POST /hub/api/users/{name}/server``,
  the spawn form's ``POST /hub/spawn`` or a spawn by query; asking again while it
  is pending, or a page that only redirects to the pending page, is not counted;
- a server stop is ``DELETE /hub/api/users/{name}/server`` (what the home page, the
  admin page and the idle culler send) that answered 202/204.

Entries go to the gpulab service (``POST /api/v1/audit``, with the service's token
that only the hub holds) from a queue in the hub. While the service is down (the
hub restarts it) they wait and are sent when it answers again, each with the time
it happened.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
import logging
import re
import time
from urllib.parse import unquote

from jupyterhub.log import log_request as jupyterhub_log_request
from tornado import web

from gpulab.enforcement.peer_account import platform_peer
from gpulab.spawner.service_client import ServiceClient

log = logging.getLogger("gpulab.hub_ext.audit")

#: Entries kept while the service does not answer; beyond it the oldest go (logged).
MAX_QUEUED = 10000
#: Entries one POST carries.
BATCH = 100
RETRY_S = 2.0

_NAME = r"(?P<name>[^/]+)"
_SERVER = r"(?:/server|/servers/(?P<server>[^/]+))"

#: (method, path under /hub/, action). Actions in :mod:`gpulab.service.operations.audit`.
RULES = [
    ("POST", r"login", "login"),
    ("GET", r"oauth_callback", "login"),
    ("POST", rf"api/users/{_NAME}{_SERVER}", "server.start"),
    ("DELETE", rf"api/users/{_NAME}{_SERVER}", "server.stop"),
    ("POST", r"spawn(?:/(?P<name>[^/]+)(?:/(?P<server>[^/]+))?)?", "server.start"),
    ("GET", r"spawn(?:/(?P<name>[^/]+)(?:/(?P<server>[^/]+))?)?", "server.start"),
    ("POST", r"api/users", "user.create"),
    ("POST", rf"api/users/{_NAME}", "user.create"),
    ("DELETE", rf"api/users/{_NAME}", "user.delete"),
    ("PATCH", rf"api/users/{_NAME}", "user.update"),
    ("POST", rf"api/users/{_NAME}/tokens", "token.create"),
    ("DELETE", rf"api/users/{_NAME}/tokens/(?P<token_id>[^/]+)", "token.delete"),
    ("POST", r"api/groups", "group.create"),
    ("POST", r"api/groups/(?P<group>[^/]+)", "group.create"),
    ("DELETE", r"api/groups/(?P<group>[^/]+)", "group.delete"),
    ("POST", r"api/groups/(?P<group>[^/]+)/users", "group.change"),
    ("DELETE", r"api/groups/(?P<group>[^/]+)/users", "group.change"),
    ("PUT", r"api/groups/(?P<group>[^/]+)/properties", "group.change"),
    ("POST", r"api/shutdown", "hub.shutdown"),
    # NativeAuthenticator's pages (gpulab's default login). Their handlers note() what
    # happened; these rules cover what the hub refused before the handler ran (403).
    ("GET", rf"authorize/{_NAME}", "user.authorize"),
    ("GET", rf"discard/{_NAME}", "user.discard"),
    ("POST", r"signup", "user.signup"),
    ("POST", r"change-password", "password.change"),
    ("POST", rf"change-password/{_NAME}", "password.change"),
]
#: Pages that answer 200 whether they worked or not: an entry only from note(), or a
#: refusal (4xx/5xx) the hub gave before the page ran.
_SAID_BY_THE_PAGE = {"user.signup", "password.change"}
#: Longest name kept for a name someone typed (a failed login, a sign-up).
MAX_TYPED_NAME = 64
_COMPILED = [(m, re.compile(p + r"/?\Z"), a) for m, p, a in RULES]


class AuditForwarder:
    """Sends entries to the gpulab service in order, holding them while it is down."""

    def __init__(self, api_url: str, token: str, service_name: str = "gpulab"):
        self.api_url = api_url
        self.token = token
        self.service_name = service_name
        self.queue: collections.deque[dict] = collections.deque()
        self._task: asyncio.Task | None = None
        self.dropped = 0

    def send(self, entry: dict) -> None:
        if len(self.queue) >= MAX_QUEUED:
            self.queue.popleft()
            self.dropped += 1
            log.error("Audit: the gpulab service has not answered; dropped an entry")
        self.queue.append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        client = ServiceClient(self.api_url, self.token, retry_seconds=30, log=None)
        while self.queue:
            batch = list(self.queue)[:BATCH]
            try:
                await client.request("POST", "/audit", body={"entries": batch})
            except web.HTTPError as e:
                if e.status_code < 500:  # refused for good: keeping it would block the rest
                    log.error("Audit: the gpulab service refused entries (%s): %s", e, batch)
                else:
                    log.warning("Audit: the gpulab service does not answer; retrying")
                    await asyncio.sleep(RETRY_S)
                    continue
            except Exception:
                log.exception("Audit: sending entries failed; retrying")
                await asyncio.sleep(RETRY_S)
                continue
            for _ in batch:
                self.queue.popleft()


_forwarder: AuditForwarder | None = None


def configure_audit(c, api_url: str, token: str, service_name: str = "gpulab") -> None:
    """Record the hub's events in the gpulab service at ``api_url`` (with its token)."""
    global _forwarder
    _forwarder = AuditForwarder(api_url, token, service_name)
    settings = dict(c.JupyterHub.get("tornado_settings", {}))
    settings["log_function"] = log_request
    c.JupyterHub.tornado_settings = settings


def log_request(handler) -> None:
    """JupyterHub's request log, then the audit entry the request makes (if any)."""
    jupyterhub_log_request(handler)
    if _forwarder is None:
        return
    try:
        entry = entry_for(handler)
    except Exception:
        log.exception("Audit: could not read %s %s", handler.request.method, handler.request.path)
        return
    if entry is not None and not _recorded_by_the_service(entry):
        _forwarder.send(entry)


def _recorded_by_the_service(entry: dict) -> bool:
    # The gpulab service stops GPU-idle servers itself and records that with the
    # reason (service/operations/actions.py): once is enough.
    return (
        entry.get("actor_kind") == "service"
        and entry.get("action") == "server.stop"
        and (entry.get("actor") == _forwarder.service_name)
    )


# -- what a page says it did ---------------------------------------------------------
def note(
    handler,
    action: str,
    result: str,
    *,
    user: str | None,
    actor: str | None = None,
    actor_kind: str = "user",
    reason: str | None = None,
    **detail,
) -> None:
    """Record this request as ``action`` ended with ``result`` (``ok``, ``denied``,
    ``failed``), about ``user``. ``actor``: for someone not logged in (a login, a
    sign-up), the name they typed; None: the hub's user of the request. ``reason``
    says why it was refused, in a few words (never a password). The entry is made
    when the request finishes: note before ``finish()`` or ``redirect()``. The last
    note wins."""
    handler.gpulab_audit = {
        "action": action,
        "result": result,
        "user": user,
        "actor": actor,
        "actor_kind": actor_kind,
        "detail": {"reason": reason, **detail},
    }


def typed_name(value: str | bytes | None) -> str | None:
    """A name someone typed, fit for the trail: bytes that are not UTF-8 and
    characters that do not print escaped (``\\xff``, ``\\u200b``), cut to
    MAX_TYPED_NAME characters. None for nothing typed."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in value.strip())
    if len(text) > MAX_TYPED_NAME:
        text = f"{text[: MAX_TYPED_NAME - 16]}...({len(text)} chars)"
    return text or None


def _noted(handler, said: dict) -> dict | None:
    name = typed_name(said["user"])
    if said["actor"] is not None:
        actor = (typed_name(said["actor"]) or "anonymous", said["actor_kind"])
    else:
        actor = actor_of(handler)
        if actor is None:
            if said["result"] == "ok":
                return None  # nothing changes without a user
            actor = ("anonymous", "user")
    return _entry(handler, actor, said["action"], name, name, said["result"], said["detail"])


# -- what a request did --------------------------------------------------------------
def _hub_prefix(handler) -> str:
    hub = handler.settings.get("hub")
    base = getattr(hub, "base_url", None) or handler.settings.get("base_url", "/") + "hub/"
    return base if base.endswith("/") else base + "/"


def result_of(status: int) -> str:
    if status < 400:
        return "ok"
    return "denied" if status in (401, 403) else "failed"


def actor_of(handler) -> tuple[str, str] | None:
    try:
        who = handler.current_user
    except Exception:
        return None
    if who is None:
        return None
    if getattr(who, "kind", "user") == "service":
        return who.name, "service"
    return who.name, "admin" if getattr(who, "admin", False) else "user"


def _body_json(handler):
    try:
        return json.loads(handler.request.body or b"null")
    except (ValueError, RecursionError):  # nested past Python's limit
        return None


def _form(handler, name: str) -> str | None:
    try:
        value = handler.get_body_argument(name, None)
    except Exception:
        return None
    return value.strip()[:255] if isinstance(value, str) else None


def _typed_field(handler, name: str) -> str | None:
    """A form field as typed (its raw bytes: they need not be UTF-8), for the trail."""
    values = handler.request.body_arguments.get(name)
    return typed_name(values[0]) if values else None


def _started_in(handler, user: str, server: str) -> bool:
    """Whether the server's start began during this request."""
    find = getattr(handler, "find_user", None)
    found = find(user) if find else None
    orm_spawner = found.orm_spawners.get(server) if found is not None else None
    started = getattr(orm_spawner, "started", None)
    if started is None:
        return False
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.UTC)
    # Both times come from this process's clock; a start before the request is not its.
    began = time.time() - handler.request.request_time()
    return started.timestamp() >= began - 0.01


def entry_for(handler) -> dict | None:
    """The audit entry for a finished request to the hub, or None."""
    request = handler.request
    prefix = _hub_prefix(handler)
    if not request.path.startswith(prefix):
        return None
    said = getattr(handler, "gpulab_audit", None)
    if said is not None:
        return _noted(handler, said)
    rest = request.path[len(prefix) :]
    status = handler.get_status()
    for method, pattern, action in _COMPILED:
        if method == request.method and (m := pattern.match(rest)):
            args = {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
            return _describe(handler, action, args, status)
    return None


def _describe(handler, action: str, args: dict, status: int) -> dict | None:
    actor = actor_of(handler)
    detail: dict = {}
    result = result_of(status)
    user = args.get("name")
    if status == 404 and actor and actor[1] == "user" and user not in (None, actor[0]):
        # The hub answers a user's request for someone else's thing as if it did not
        # exist; it was refused.
        result = "denied"
    subject = user
    if action == "login":
        if status in (301, 302, 303, 307) and actor is not None:
            result = "ok"
        elif status in (401, 403):
            name = _typed_field(handler, "username") or "unknown"
            actor = (name, "user")
        else:
            return None  # the login page itself, or a form that was not filled in
        user = subject = actor[0]
    elif action == "server.start":
        user = user or (actor[0] if actor else None)
        if user is None:
            return None
        server = args.get("server", "")
        subject = f"{user}/{server}"
        if result == "ok":
            if not _started_in(handler, user, server):
                return None  # pending already, running, or only the form
            options = _body_json(handler) if handler.request.method == "POST" else None
            if isinstance(options, dict) and "gpu_milli" in options:
                detail["gpu_milli"] = options["gpu_milli"]
            else:
                milli = _form(handler, "gpu_milli") or handler.get_argument("gpu_milli", None)
                if milli is not None:
                    detail["gpu_milli"] = int(milli) if milli.isdigit() else milli[:32]
        elif result == "failed" and status < 500:
            return None  # already running, pending: nothing changed
    elif action == "server.stop":
        subject = f"{user}/{args.get('server', '')}"
        if result == "failed" and status < 500:
            return None
    elif action == "user.create" and user is None:
        body = _body_json(handler)
        names = body.get("usernames") if isinstance(body, dict) else None
        names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
        subject = ",".join(names)[:255] or "-"
        detail["users"] = names[:50]
    elif action == "user.update":
        body = _body_json(handler)
        if isinstance(body, dict) and "admin" in body:
            action = "user.admin"
            detail["admin"] = bool(body["admin"])
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            detail["new_name"] = body["name"][:255]
    elif action == "token.create":
        body = _body_json(handler)
        if isinstance(body, dict):
            detail.update({k: body[k] for k in ("note", "expires_in", "scopes") if k in body})
    elif action == "token.delete":
        detail["token_id"] = args.get("token_id")
    elif action.startswith("group."):
        group = args.get("group")
        user = None  # a group is nobody's own thing
        body = _body_json(handler)
        if group is None:  # POST api/groups: several at once
            names = body.get("groups") if isinstance(body, dict) else None
            names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
            group = ",".join(names)[:255] or "-"
        subject = group
        if handler.request.path.endswith("/users") and isinstance(body, dict):
            users = body.get("users")
            if isinstance(users, list):
                op = "add_users" if handler.request.method == "POST" else "remove_users"
                detail[op] = [u for u in users if isinstance(u, str)][:50]
        elif handler.request.path.endswith("/properties") and isinstance(body, dict):
            detail["properties"] = body
    elif action == "hub.shutdown":
        subject, user = "hub", None
    elif action in _SAID_BY_THE_PAGE:
        if result == "ok":
            return None  # a 200 says nothing here, and the page did not note()
        if action == "user.signup":
            user = subject = _typed_field(handler, "username")
            actor = (user or "anonymous", "user")
        else:
            user = subject = user or (actor[0] if actor else None)
    if actor is None:
        if result == "ok":
            return None  # nothing changes without a user
        actor = ("anonymous", "user")
    return _entry(handler, actor, action, user, subject, result, detail)


def _entry(handler, actor, action, user, subject, result, detail) -> dict:
    return {
        "ts": dt.datetime.now(dt.UTC).isoformat(),
        "actor": actor[0],
        "actor_kind": actor[1],
        "user": user,
        "action": action,
        "subject": subject or "-",
        "result": result,
        "peer": _peer(handler),
        "forwarded_for": handler.request.headers.get("X-Forwarded-For"),
        # Whether the peer is the hub's proxy (this account's socket) or a user's kernel
        # on the same loopback: only the proxy's X-Forwarded-For is believed.
        "peer_is_platform": _peer_is_platform(handler),
        "detail": {k: v for k, v in detail.items() if v is not None},
    }


def _peer_is_platform(handler) -> bool | None:
    connection = handler.request.connection
    address = getattr(getattr(connection, "context", None), "address", None)
    sock = getattr(getattr(connection, "stream", None), "socket", None)
    if not isinstance(address, tuple) or sock is None:
        return None
    try:
        return platform_peer(address, sock.getsockname())
    except OSError:
        return None


def _peer(handler) -> str:
    address = getattr(getattr(handler.request.connection, "context", None), "address", None)
    return address[0] if isinstance(address, tuple) and address else handler.request.remote_ip
