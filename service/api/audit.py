"""``/api/v1/audit``: read the audit trail (:mod:`gpulab.service.operations.audit`), and the hub's
way in.

``GET`` (users: entries about their things or done by them; admins: all)::

    GET api/v1/audit?user=&actor=&action=&subject=&result=&since=&until=&limit=&before=
    GET api/v1/audit?...&format=jsonl      every matching entry, one JSON object a line

``POST`` takes the hub's events (logins, server starts and stops, admin actions
on users and groups): only the gpulab service's own token, which the hub holds,
may send them (:mod:`gpulab.hub_ext.audit_hook`).
"""

from __future__ import annotations

import json

from tornado import web
from tornado.iostream import StreamClosedError

from gpulab.service.api.query_args import int_arg, time_arg
from gpulab.service.auth import MEMBERSHIP_EVENTS, TOKEN_EVENTS, APIHandler, forget_tokens_of
from gpulab.service.operations.audit import (
    ACTION_PATTERN,
    ACTOR_KINDS,
    RESULTS,
    AuditFilters,
    AuditLog,
    client_source,
)

MAX_LIMIT = 1000
#: Most entries one POST from the hub may carry.
MAX_POSTED = 500


class AuditHandler(APIHandler):
    @property
    def trail(self) -> AuditLog:
        trail = self.gpulab.audit
        if trail is None:
            raise web.HTTPError(503, "the audit trail is not running; try again")
        return trail

    def filters(self) -> AuditFilters:
        who = self.require_identity()
        arg = self.get_argument
        f = AuditFilters(
            user=arg("user", None) or None,
            actor=arg("actor", None) or None,
            action=arg("action", None) or None,
            subject=arg("subject", None) or None,
            result=arg("result", None) or None,
        )
        if not (who.admin or who.internal) and f.user not in (None, who.name):
            raise web.HTTPError(
                403, "you can only read your own audit entries; leave out user= or set it to you"
            )
        if f.result is not None and f.result not in RESULTS:
            raise web.HTTPError(400, f"result must be one of {', '.join(RESULTS)}")
        action = f.action[:-2] if f.action and f.action.endswith(".*") else f.action
        if action is not None and not ACTION_PATTERN.match(action):
            raise web.HTTPError(
                400,
                f"action={f.action!r} is not an action name: use one like job.submit, "
                f"or a prefix like deployment.* (docs/howto/audit.md lists them)",
            )
        for name in ("since", "until"):
            value = arg(name, None)
            if value is not None:
                setattr(f, name, time_arg(name, value))
        if f.since and f.until and f.since >= f.until:
            raise web.HTTPError(400, "since must be before until")
        return f

    async def get(self):
        filters = self.filters()
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "jsonl"):
            raise web.HTTPError(400, f"format must be json or jsonl, got {fmt!r}")
        if fmt == "jsonl":
            await self._export(filters)
            return
        limit = int_arg("limit", self.get_argument("limit", None), 100, 1, MAX_LIMIT)
        before = int_arg("before", self.get_argument("before", None), None, 1)
        entries, next_before = await self.trail.query(self.identity, filters, limit, before)
        self.write_json({"entries": entries, "next_before": next_before})

    async def _export(self, filters: AuditFilters) -> None:
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Content-Disposition", 'attachment; filename="gpulab-audit.jsonl"')
        try:
            async for rows in self.trail.export(self.identity, filters):
                self.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                await self.flush()
        except StreamClosedError:
            return
        self.finish()

    async def post(self):
        """The hub's events: ``{"entries": [{ts, actor, actor_kind, user, action,
        subject, result, peer, forwarded_for, peer_is_platform, detail}]}``."""
        who = self.require_identity()
        if not who.internal:
            raise web.HTTPError(
                403, "only the hub records audit entries here (with the gpulab service's token)"
            )
        body = self.json_body()
        entries = body.get("entries")
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_POSTED:
            raise web.HTTPError(400, f"'entries' must be a list of 1 to {MAX_POSTED} objects")
        checked = [self._entry(e) for e in entries]
        ids = []
        for kwargs in checked:
            action = kwargs.pop("action")
            if action in TOKEN_EVENTS and kwargs.get("user") and kwargs["result"] == "ok":
                forget_tokens_of(self.gpulab, kwargs["user"])  # a revoked token: now
            if action in MEMBERSHIP_EVENTS and kwargs["result"] == "ok":
                self.gpulab.hub.forget_memberships()
            ids.append(await self.trail.record(action, kwargs.pop("subject"), **kwargs))
        self.write_json({"ids": ids}, status=201)

    def _entry(self, e) -> dict:
        if not isinstance(e, dict):
            raise web.HTTPError(400, "each entry must be a JSON object")

        def text(key, required=True):
            value = e.get(key)
            if value is None and not required:
                return None
            if not isinstance(value, str) or not value or "\x00" in value:
                raise web.HTTPError(400, f"entry field {key!r} must be a non-empty string")
            return value

        action = text("action")
        if not ACTION_PATTERN.match(action):
            raise web.HTTPError(400, f"entry action {action!r} is not a dotted lower-case name")
        kind = text("actor_kind")
        if kind not in ACTOR_KINDS:
            raise web.HTTPError(400, f"entry actor_kind must be one of {', '.join(ACTOR_KINDS)}")
        result = text("result")
        if result not in RESULTS:
            raise web.HTTPError(400, f"entry result must be one of {', '.join(RESULTS)}")
        detail = e.get("detail") or {}
        if not isinstance(detail, dict):
            raise web.HTTPError(400, "entry detail must be a JSON object")
        peer = e.get("peer") or "unknown"
        forwarded = e.get("forwarded_for")
        platform = e.get("peer_is_platform")  # the hub looked its peer's socket up
        return {
            "action": action,
            "subject": text("subject"),
            "actor": text("actor"),
            "actor_kind": kind,
            "user": text("user", required=False),
            "result": result,
            "ts": time_arg("ts", text("ts")),
            "source": client_source(
                str(peer),
                forwarded if isinstance(forwarded, str) else None,
                self.trail.trusted_proxies,
                peer_is_platform=platform if isinstance(platform, bool) else None,
            ),
            **{f"{k}": v for k, v in detail.items() if k not in _RESERVED},
        }


#: Names record() takes itself; a detail key of the same name is dropped.
_RESERVED = {"action", "subject", "actor", "actor_kind", "user", "source", "result", "ts"}

routes = [(r"api/v1/audit", AuditHandler)]
