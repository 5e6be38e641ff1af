"""The audit trail: who changed what, when, from where, and how it ended.

One row per change in ``gpulab_audit`` (:mod:`gpulab.db.operations`). The service's
own change routes record through ``APIHandler.audit`` (:mod:`.auth`); the hub's
events (logins, server starts and stops, admin actions on users and groups) come
from the hub's request hook (:mod:`gpulab.hub_ext.audit_hook`) through
``POST /api/v1/audit``. Other parts of the service call :meth:`AuditLog.record`
directly, e.g. ``await service.audit.record("gpu.cordon", uuid, actor="gpulab",
actor_kind="system", reason="xid 79")``.

A route's entry is committed before the route answers, so a ``kill -9`` of the
service right after an answer loses nothing. Writes run on the ledger's threads,
off the event loop. Entries older than ``c.AuditTrail.audit_retention_days``
are deleted once an hour (0: kept forever).

Actions (``result`` is ``ok``, ``denied`` for refused attempts, or ``failed``):

======================  ==========================================================
login                   a login at the hub (failed logins: ``denied``, with the reason:
                        bad password, unknown user, not approved, locked out...)
logout                  a logout at the hub (gpulab's default login)
server.start            a single-user server started (by its user or an admin)
server.stop             a server stopped through the hub (by its user, an admin,
                        or a service such as the idle culler), or by gpulab itself
                        when its GPU idled (gpu_idle_cull_seconds; with the reason)
server.hibernate        a server's kernels saved and the server stopped (by its user,
                        or gpulab: idle, or to make room; failed: it ran on)
server.wake             a hibernated kernel came back in its user's kernel
allocation.create       a slice allocated through ``POST /allocations``
allocation.release      slices released through ``DELETE /allocations``
job.submit / job.cancel a training job
job.restart             gpulab restarted a stalled job (job_stall_restarts)
deployment.create       a new endpoint
deployment.update       a new (canary) version, or its settings changed
deployment.share        who may call it changed
deployment.promote      the canary took all the traffic
deployment.rollback     the stable version took all the traffic back
deployment.delete       an endpoint stopped
gpu.cordon / .uncordon  a GPU taken out of placement / put back
user.create / .delete   hub users (admins)
user.admin              a user's admin flag changed
user.update             other changes of a user (their name)
user.signup             someone signed up (refused: ``denied``/``failed``, the reason)
user.authorize          an admin approved (or revoked) a sign-up
user.discard            an admin discarded a sign-up
password.change         a user changed their password, or an admin set one
token.create / .delete  hub API tokens (the token itself is never kept)
group.create / .delete  hub groups
group.change            members added or removed, or properties (quotas) set
hub.shutdown            the hub was shut down through its API
======================  ==========================================================
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import ipaddress
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable

from sqlalchemy.engine import Engine

from gpulab.db.operations import AuditFilters, AuditStore, utc

# Who a request came from (LOOPBACK: the proxies trusted by default): the hub's login
# throttle asks the same, so the answer lives beside the socket-owner lookup.
from gpulab.enforcement.peer_account import LOOPBACK, client_source  # noqa: F401
from gpulab.service.operations.denials import DenialThrottle
from gpulab.service.tasks import KeptTask

log = logging.getLogger("gpulab.service.operations.audit")

#: Every action name the service and the hub record (see the module's table).
ACTIONS = (
    "login",
    "logout",
    "server.start",
    "server.stop",
    "allocation.create",
    "allocation.release",
    "job.submit",
    "job.cancel",
    "job.restart",
    "deployment.create",
    "deployment.update",
    "deployment.share",
    "deployment.promote",
    "deployment.rollback",
    "deployment.delete",
    "gpu.cordon",
    "gpu.uncordon",
    "alert.acknowledge",
    "user.create",
    "user.delete",
    "user.admin",
    "user.update",
    "user.signup",
    "user.authorize",
    "user.discard",
    "password.change",
    "token.create",
    "token.delete",
    "group.create",
    "group.delete",
    "group.change",
    "hub.shutdown",
)
ACTOR_KINDS = ("user", "admin", "service", "system")
RESULTS = ("ok", "denied", "failed")
#: What an action name looks like (others' code may add names of its own).
ACTION_PATTERN = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\Z")

#: Largest ``detail`` kept, as JSON; bigger values are cut.
MAX_DETAIL_CHARS = 2000
#: Keys never kept in ``detail``, whatever a caller passes.
SECRET_KEY = re.compile(r"token|password|secret|authorization|cookie|api_key", re.I)
PRUNE_EVERY_S = 3600.0
#: Rows a ``format=jsonl`` export reads per database round trip.
EXPORT_BATCH = 1000


def clean_detail(detail: dict) -> str:
    """``detail`` as a small JSON object: secrets' keys dropped, long values cut."""
    out = {}
    for key, value in detail.items():
        if value is None or SECRET_KEY.search(str(key)):
            continue
        if not isinstance(value, str | int | float | bool | list | dict):
            value = str(value)
        out[str(key)[:64]] = value
    text = json.dumps(out, default=str, ensure_ascii=False, sort_keys=True)
    if len(text) > MAX_DETAIL_CHARS:
        short = {
            k: (v if len(json.dumps(v, default=str)) <= 200 else "...") for k, v in out.items()
        }
        text = json.dumps(short, default=str, ensure_ascii=False, sort_keys=True)
        if len(text) > MAX_DETAIL_CHARS:
            text = json.dumps({"truncated": True})
    return text


def proxy_networks(trusted: Iterable[str]) -> tuple:
    """Parsed networks of trusted proxies; ValueError names a bad one."""
    out = []
    for n in trusted:
        try:
            out.append(ipaddress.ip_network(n, strict=False))
        except ValueError:
            raise ValueError(
                f"c.AuditTrail.audit_trusted_proxies: {n!r} is not an address or "
                f"network (write it like 10.0.0.0/8 or 127.0.0.1)"
            ) from None
    return tuple(out)


class AuditLog:
    """Append and read the audit trail. ``run`` runs blocking calls off the event loop
    (the ledger's ``aio.run``; default: a thread of asyncio's)."""

    def __init__(
        self,
        engine: Engine,
        run: Callable | None = None,
        retention_days: float = 365,
        trusted_proxies: Iterable[str] = LOOPBACK,
        denials_per_minute: int = 60,
    ):
        self.engine = engine
        self.rows = AuditStore(engine)
        self._run = run
        self.retention_days = retention_days
        self.trusted_proxies = proxy_networks(trusted_proxies)
        self._pruner = KeptTask("gpulab-audit-prune", self._prune_loop)
        self._soon: set[asyncio.Task] = set()
        self.denials = DenialThrottle(denials_per_minute)

    async def _off_loop(self, fn, *args, **kwargs):
        if self._run is not None:
            return await self._run(fn, *args, **kwargs)
        return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))

    # -- writing -------------------------------------------------------------------------
    def record_sync(
        self,
        action: str,
        subject: str,
        *,
        actor: str = "gpulab",
        actor_kind: str = "system",
        user: str | None = None,
        source: str = "gpulab",
        result: str = "ok",
        ts: dt.datetime | None = None,
        **detail,
    ) -> int:
        """Append one entry and commit it; its id. Blocks (use :meth:`record` on a loop)."""
        if not ACTION_PATTERN.match(action) or len(action) > 64:
            raise ValueError(f"audit action {action!r} is not a dotted lower-case name")
        if actor_kind not in ACTOR_KINDS:
            raise ValueError(f"actor_kind must be one of {', '.join(ACTOR_KINDS)}")
        if result not in RESULTS:
            raise ValueError(f"result must be one of {', '.join(RESULTS)}")
        values = {
            "ts": utc(ts) if ts is not None else dt.datetime.now(dt.UTC),
            "actor": str(actor)[:255] or "unknown",
            "actor_kind": actor_kind,
            "user": None if user is None else str(user)[:255],
            "action": action,
            "subject": str(subject)[:255] or "-",
            "source": str(source)[:255] or "unknown",
            "result": result,
            "detail": clean_detail(detail),
        }
        return self.rows.add(values)

    async def record(self, action: str, subject: str, **kwargs) -> int | None:
        """:meth:`record_sync` off the event loop. The trail never breaks the change it
        describes: a failed write is logged (with the entry) and None returned."""
        try:
            return await self._off_loop(self.record_sync, action, subject, **kwargs)
        except ValueError:
            raise
        except Exception:
            log.exception("Could not write the audit entry %s %s %s", action, subject, kwargs)
            return None

    def record_soon(self, action: str, subject: str, **kwargs) -> asyncio.Task:
        """:meth:`record` without waiting (where the answer cannot wait: an error page
        already on its way). :meth:`stop` waits for what is still being written."""
        task = asyncio.ensure_future(self.record(action, subject, **kwargs))
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)
        return task

    def record_refusal_soon(self, action: str, subject: str, **kwargs) -> None:
        """A refused change (``result="denied"``), written as :meth:`record_soon`
        unless its actor is past ``denials_per_minute`` (:mod:`.denials`)."""
        unwritten = self.denials.admit(str(kwargs.get("actor", "")))
        if unwritten is None:
            return
        if unwritten:
            kwargs["unwritten_denials"] = unwritten
        self.record_soon(action, subject, result="denied", **kwargs)

    # -- reading -------------------------------------------------------------------------
    def query_sync(
        self, viewer, filters: AuditFilters, limit: int = 100, before_id: int | None = None
    ) -> tuple[list[dict], int | None]:
        """Entries ``viewer`` may read (users: theirs, as owner or actor; admins and
        None: all), newest first; and the ``before_id`` of the next page (None: last)."""
        sees_all = viewer is None or viewer.admin or viewer.internal
        return self.rows.read(filters, None if sees_all else viewer.name, limit, before_id)

    async def query(
        self, viewer, filters: AuditFilters, limit: int = 100, before_id: int | None = None
    ) -> tuple[list[dict], int | None]:
        return await self._off_loop(self.query_sync, viewer, filters, limit, before_id)

    async def export(self, viewer, filters: AuditFilters) -> AsyncIterator[list[dict]]:
        """Every matching entry, newest first, in batches (for the JSON-lines export)."""
        before = None
        while True:
            rows, before = await self.query(viewer, filters, EXPORT_BATCH, before)
            if rows:
                yield rows
            if before is None:
                return

    # -- retention -----------------------------------------------------------------------
    def prune_sync(self, now: dt.datetime | None = None) -> int:
        """Delete entries older than the retention; how many went."""
        if not self.retention_days or self.retention_days <= 0:
            return 0
        cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=self.retention_days)
        return self.rows.prune(cutoff)

    async def _prune_loop(self) -> None:
        while True:
            try:
                gone = await self._off_loop(self.prune_sync)
                if gone:
                    log.info(
                        "Audit: deleted %d entr%s older than %g day(s)",
                        gone,
                        "y" if gone == 1 else "ies",
                        self.retention_days,
                    )
            except Exception:
                log.exception("Pruning the audit trail failed; trying again in an hour")
            await asyncio.sleep(PRUNE_EVERY_S)

    async def start(self) -> None:
        if self.retention_days and self.retention_days > 0:
            self._pruner.start()

    async def stop(self) -> None:
        if self._soon:
            await asyncio.gather(*self._soon, return_exceptions=True)
        await self._pruner.stop()
