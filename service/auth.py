"""Who is asking: every request to the service is identified through the hub.

A request carries ``Authorization: token <jupyterhub token>`` or the browser's
hub OAuth cookie for this service. The hub answers who the token belongs to;
the service then looks the user up (admin flag, groups) with its own token,
because OAuth tokens issued to a browser carry too few scopes to say so.

Three kinds of caller:

- ``internal``: the gpulab service's own token, which the hub's spawner uses
  to allocate on behalf of any user;
- admins (``admin`` in the hub's user model): see and act on everything;
- users: see and act on their own things only.

A revoked token stops working in time (:class:`TokenAnswers`): a request that
changes something (POST, PUT, PATCH, DELETE) always asks the hub afresh; one that
only reads reuses the hub's answer for at most :data:`TOKEN_CACHE_S` seconds, and
the hub's ``token.delete`` event drops the user's answers at once
(:func:`forget_tokens_of`).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from dataclasses import dataclass, field

from jupyterhub.services.auth import HubAuth, HubOAuth, HubOAuthenticated, _ExpiringDict
from tornado import web

from gpulab.enforcement.peer_account import (
    LOOPBACK,
    client_source,
    platform_peer,
    refuse_foreign_listener,
)
from gpulab.service.api.request_body import BoundedBody
from gpulab.service.hub_down import HUB_DOWN, hub_unreachable

log = logging.getLogger("gpulab.service")

#: Seconds the hub's answer for a token is reused by requests that change nothing
#: (and by the endpoint router): how long a revoked token may still read.
TOKEN_CACHE_S = 5
#: Methods that change nothing; any other asks the hub about its token every time.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: Set while a request that changes something is identified (see TokenAnswers).
_asks_afresh: ContextVar[bool] = ContextVar("gpulab_token_asks_afresh", default=False)


class _AsksOnlyTheHub:
    """Every call to the hub's API carries this process's own token (the service's,
    with its role; an OAuth code exchange sends it as the client secret too): none goes
    to a port of this machine that another account listens on, as a user's kernel can
    once the hub is down (an OAuth callback with any code would send it there)."""

    async def _api_request(self, method, url, /, **kwargs):
        await refuse_foreign_listener(url, "the hub's API")
        return await super()._api_request(method, url, **kwargs)


class GuardedHubAuth(_AsksOnlyTheHub, HubAuth):
    """:class:`HubAuth` that sends its token to no other account's listener."""


class GuardedHubOAuth(_AsksOnlyTheHub, HubOAuth):
    """:class:`HubOAuth` that sends its token to no other account's listener."""


class TokenAnswers(_ExpiringDict):
    """The hub's answers about tokens (``HubOAuth.cache``), kept ``max_age`` seconds,
    but never used for a request that changes something: the hub is asked again
    (and the fresh answer kept), so a token revoked a moment ago cannot cancel a
    job or release a slice. JupyterHub's own cache is this dict's parent class."""

    def __getitem__(self, key):
        if _asks_afresh.get():
            raise KeyError(key)  # the caller asks the hub, then stores the answer
        return super().__getitem__(key)

    def forget(self, name: str) -> int:
        """Drop every answer that named ``name`` (a token of theirs was revoked)."""
        keys = [
            k for k, v in list(self.values.items()) if isinstance(v, dict) and v.get("name") == name
        ]
        for key in keys:
            self.pop(key, None)
        return len(keys)


#: The hub's events after which a user's cached token answers are dropped at once.
TOKEN_EVENTS = frozenset({"token.delete", "user.delete"})
#: The hub's events after which its answers about groups and users are asked anew:
#: quotas, guarantees, shares and usage by group follow a membership change at once.
MEMBERSHIP_EVENTS = frozenset(
    {"group.create", "group.delete", "group.change", "user.update", "user.delete"}
)


def forget_tokens_of(service, name: str) -> None:
    """The hub revoked a token of ``name`` (or removed them): the service's answers
    about their tokens go now, not TOKEN_CACHE_S later (the hub says so through its
    audit events, :mod:`gpulab.hub_ext.audit_hook`)."""
    if HubOAuth.initialized() and isinstance(HubOAuth.instance().cache, TokenAnswers):
        HubOAuth.instance().cache.forget(name)
    if service.deployments is not None:
        service.deployments.router.tokens.forget(name)


@dataclass(frozen=True)
class Identity:
    name: str
    kind: str  # "user" or "service"
    admin: bool = False
    internal: bool = False
    groups: frozenset[str] = field(default_factory=frozenset)

    def can_act_for(self, user: str) -> bool:
        return self.internal or self.admin or (self.kind == "user" and self.name == user)


async def identity_of(model: dict, hub, service_name: str) -> Identity:
    """Who the hub's token model is: a service (the internal one is gpulab's own), or
    a user with the admin flag and groups the hub (``hub``, a ``HubAPI``) says."""
    if model.get("kind") == "service":
        return Identity(model["name"], "service", internal=model["name"] == service_name)
    user = await hub.user(model["name"]) or {}
    return Identity(
        model["name"],
        "user",
        admin=bool(user.get("admin")),
        groups=frozenset(user.get("groups") or []),
    )


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Identifies the caller in :meth:`prepare`; JSON errors for API routes."""

    @property
    def gpulab(self):
        return self.settings["gpulab"]

    async def prepare(self):
        self.identity: Identity | None = None
        self._forbidden_model = None
        afresh = _asks_afresh.set(self.changes_state())
        try:
            model = await self.hub_auth.get_user(self, sync=False)
            #: The hub's model of the caller (with the token's ``scopes``), or None.
            self.hub_model: dict | None = model or None
            if model:
                if not self.hub_auth.check_scopes(self.hub_scopes, model):
                    # Authenticated, but the token may not use this service.
                    self._forbidden_model = model
                else:
                    self.identity = await self.gpulab.identify(model)
        except Exception as e:
            # The hub down or restarting: the caller is told so and to retry (a 503),
            # not an internal error of the service.
            if hub_unreachable(e):
                raise web.HTTPError(503, HUB_DOWN) from None
            raise
        finally:
            _asks_afresh.reset(afresh)

    def get_current_user(self):
        return self.identity

    def changes_state(self) -> bool:
        """Whether this request may change something: then its token is checked with
        the hub itself, never a cached answer. (An endpoint call only reads.)"""
        return self.request.method not in READ_METHODS

    def allowed_methods(self) -> list[str]:
        """The methods this route answers: its 405 says them in ``Allow`` (RFC 9110)."""
        return [
            m
            for m in HTTP_METHODS
            if getattr(type(self), m.lower()) is not getattr(web.RequestHandler, m.lower())
        ]

    def set_allow(self, status_code: int) -> None:
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))

    def write_error(self, status_code: int, **kwargs) -> None:
        self.set_allow(status_code)
        super().write_error(status_code, **kwargs)

    def require_identity(self) -> Identity:
        if self.identity is not None:
            return self.identity
        raise self.stranger_refusal()

    def stranger_refusal(self) -> web.HTTPError:
        """What a caller the service may not serve is told: 403 for a token without
        the service's scope, else 401."""
        if self._forbidden_model is not None:
            return web.HTTPError(
                403,
                f"{self._forbidden_model.get('kind', 'user')} "
                f"{self._forbidden_model.get('name')} may not use the gpulab service: "
                f"the token lacks the scope access:services!service=gpulab",
            )
        return web.HTTPError(
            401,
            "authentication required: send 'Authorization: token <JupyterHub API token>'"
            " (create one on the hub's token page) or log in to the hub",
        )


def actor_kind(who: Identity) -> str:
    """How the audit trail names the kind of caller (:mod:`gpulab.service.operations.audit`)."""
    if who.kind == "service":
        return "service"
    return "admin" if who.admin else "user"


@web.stream_request_body
class APIHandler(BoundedBody, BaseHandler):
    """JSON routes. Bodies stream in and are bounded per route
    (:mod:`gpulab.service.api.request_body`)."""

    #: The audit action a refused (403) request of each method is recorded as
    #: (``{"POST": "job.submit"}``); the subject is the path's arguments, unless the
    #: handler has set ``audit_subject`` (and ``audit_user``, whose thing it was).
    audit_actions: dict[str, str] = {}
    audit_subject: str | None = None
    audit_user: str | None = None

    async def prepare(self):
        # Refuse an oversized body before asking the hub who sent it.
        self.check_body_size()
        if any("\x00" in a for a in self.path_args if isinstance(a, str)):
            # A NUL reaches no row, and PostgreSQL refuses it outright (a 500).
            raise web.HTTPError(400, "the URL path holds a NUL byte (%00)")
        await super().prepare()
        if self.identity is None and self.request.method not in READ_METHODS:
            # A caller the service may not serve: the body is read and dropped, never
            # kept, and the 401 or 403 answered once it is in (see BoundedBody).
            self.refuse_after_body(self.stranger_refusal())
        elif self.identity is not None:
            self.hold_body_room(f"{self.identity.kind}:{self.identity.name}")

    def on_finish(self):
        self.release_body_room()
        super().on_finish()

    def on_connection_close(self):
        self.release_body_room()  # the caller went away mid-body: on_finish never comes
        super().on_connection_close()

    def check_xsrf_cookie(self):
        # Token-authenticated requests need no XSRF token; cookie-authenticated
        # ones go through the hub's check (the mixin patches this method).
        return super().check_xsrf_cookie()

    def set_default_headers(self):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def listed_user(self, what: str) -> str | None:
        """The ``?user=`` a listing is for: users get their own, admins any (None: all)."""
        who = self.require_identity()
        user = self.get_argument("user", None)
        if not (who.admin or who.internal):
            if user not in (None, who.name):
                raise web.HTTPError(403, f"you can only list your own {what}")
            user = who.name
        return user

    def audit_source(self) -> str:
        """The client's address: the peer, or what trusted proxies forwarded for (a
        peer on this machine only when it is the platform's own account: the hub's
        proxy, never a user's kernel)."""
        address = getattr(getattr(self.request.connection, "context", None), "address", None)
        peer = address[0] if isinstance(address, tuple) and address else self.request.remote_ip
        trail = self.gpulab.audit
        trusted = trail.trusted_proxies if trail is not None else LOOPBACK
        forwarded = self.request.headers.get("X-Forwarded-For")
        platform = None
        if forwarded and isinstance(address, tuple):
            # Looked up once per connection (the proxy keeps its connections open):
            # reading /proc/net/tcp takes milliseconds on a busy host.
            stream = getattr(self.request.connection, "stream", None)
            platform = getattr(stream, "gpulab_peer_is_platform", "unknown")
            if platform == "unknown":
                platform = platform_peer(address, self._local_address())
                if stream is not None:
                    stream.gpulab_peer_is_platform = platform
        return client_source(peer, forwarded, trusted, peer_is_platform=platform)

    def _local_address(self) -> tuple | None:
        sock = getattr(getattr(self.request.connection, "stream", None), "socket", None)
        try:
            return sock.getsockname() if sock is not None else None
        except OSError:
            return None

    def _audit_fields(self, user: str | None) -> dict:
        who = getattr(self, "identity", None)
        if who is not None:
            actor, kind = who.name, actor_kind(who)
        else:
            model = getattr(self, "_forbidden_model", None) or {}
            actor = model.get("name") or "anonymous"
            kind = "service" if model.get("kind") == "service" else "user"
        return {
            "actor": actor,
            "actor_kind": kind,
            "user": user if user is not None else self.get_argument("user", None) or actor,
            "source": self.audit_source(),
        }

    async def audit(self, action: str, subject, *, user: str | None = None, result="ok", **detail):
        """Record a change this request made (committed before the route answers).
        ``user``: whose thing it is (default: ``?user=`` or the caller's own)."""
        trail = self.gpulab.audit
        if trail is not None:
            await trail.record(
                action, str(subject), result=result, **self._audit_fields(user), **detail
            )

    def _audit_refusal(self) -> None:
        action = self.audit_actions.get(self.request.method)
        trail = self.gpulab.audit
        if action is None or trail is None:
            return
        subject = "/".join(a for a in self.path_args if isinstance(a, str))
        subject = subject or self.get_argument("owner", None) or self.request.path
        subject = self.audit_subject or subject
        trail.record_refusal_soon(action, subject, **self._audit_fields(self.audit_user))

    def write_error(self, status_code: int, **kwargs) -> None:
        self.set_allow(status_code)
        if status_code == 403:
            try:
                self._audit_refusal()
            except Exception:  # the refusal is answered whatever the trail does
                log.exception("Could not record a refused %s", self.request.method)
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        if isinstance(exc, web.HTTPError) and exc.log_message:
            # Tornado stores a message without args %-escaped ("%%deploy").
            message = exc.log_message % exc.args
        if status_code >= 500 and not (
            # Ours on purpose, and what to do about it ("the engine is restarting; try
            # again"): said. Anything else of 5xx may hold what only the log should.
            status_code in (502, 503, 504) and isinstance(exc, web.HTTPError) and exc.log_message
        ):
            message = "internal error in the gpulab service; see its log"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))
