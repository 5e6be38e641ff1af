"""Hibernations: a server's kernels saved to the user's files and its slice given back.

- ``POST /api/v1/hibernations`` ``{"server": "", "user": "alice"}``: hibernate a
  running server (``user``: admins only, default the caller). Answers 202 with the
  row in state ``saving``; the saving and the stop run in the background, and
  ``GET /hibernations/{id}`` says how it ended (``hibernated`` or ``failed`` with
  ``error``; a failed one left the server running).
- ``GET /api/v1/hibernations?user=&server=``: newest first; users see their own,
  admins anyone's.
- ``GET /api/v1/hibernations/{id}``: one.
- ``POST /api/v1/hibernations/{id}/wakes``: a kernel of that hibernation came back
  and says what did (``{"name", "restored": [names], "failed": [{"name", "why"}],
  "seconds", "device"}``); sent by the user's own kernel with its server's token.
  The row keeps how many came back and failed (``restored_count``,
  ``failed_count``) and the first names of each, not every name.

No route reads or returns the kernels' state: it stays in the user's files.
"""

from __future__ import annotations

import math

from tornado import web

from gpulab.service.auth import APIHandler, actor_kind
from gpulab.service.hibernation.manager import HibernationError

#: Names of each list a wake report keeps (the counts are kept whole): each saved
#: kernel has its report on the hibernation's row, which every listing reads.
MAX_SHOWN = 20
MAX_TEXT = 300


def _text(value, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise web.HTTPError(400, f"{what} must be a string")
    return value[:limit]


def wake_report(body: dict) -> dict:
    """The wake report, checked and cut to size."""
    unknown = set(body) - {"name", "restored", "failed", "seconds", "device"}
    if unknown:
        raise web.HTTPError(400, f"unknown fields: {', '.join(sorted(unknown))}")
    name = _text(body.get("name"), "'name'", 255)
    if not name:
        raise web.HTTPError(400, "'name' (the kernel's name in the hibernation) is required")
    restored = body.get("restored") or []
    failed = body.get("failed") or []
    if not isinstance(restored, list) or not isinstance(failed, list):
        raise web.HTTPError(400, "'restored' and 'failed' must be lists")
    seconds = body.get("seconds", 0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise web.HTTPError(400, "'seconds' must be a number of seconds >= 0")
    out_failed = []
    for item in failed[:MAX_SHOWN]:
        if not isinstance(item, dict):
            raise web.HTTPError(400, 'each of \'failed\' must be {"name": ..., "why": ...}')
        name_ = _text(item.get("name"), "a failed name", 255)
        out_failed.append({"name": name_, "why": _text(item.get("why", ""), "'why'")})
    return {
        "name": name,
        "restored": [_text(n, "a restored name", 255) for n in restored[:MAX_SHOWN]],
        "restored_count": len(restored),
        "failed": out_failed,
        "failed_count": len(failed),
        "seconds": round(float(seconds), 3) if math.isfinite(seconds) else 0.0,
        "device": _text(body.get("device") or "cpu", "'device'", 32),
    }


class HibernationsHandler(APIHandler):
    audit_actions = {"POST": "server.hibernate"}

    async def get(self):
        user = self.listed_user("hibernations")
        server = self.get_argument("server", None)
        self.write_json(await self.gpulab.hibernations.list(user, server))

    async def post(self):
        who = self.require_identity()
        body = self.json_body()
        unknown = set(body) - {"user", "server"}
        if unknown:
            raise web.HTTPError(400, f"unknown fields: {', '.join(sorted(unknown))}")
        user = body.get("user") or who.name
        server = body.get("server") or ""
        if not isinstance(user, str) or not isinstance(server, str):
            raise web.HTTPError(400, "'user' and 'server' must be strings")
        self.audit_subject, self.audit_user = f"{user}/{server}", user
        if not who.can_act_for(user):
            raise web.HTTPError(403, "you can only hibernate your own servers")
        try:
            row = await self.gpulab.hibernations.request(
                user,
                server,
                reason=f"asked by {who.name}",
                actor=who.name,
                actor_kind=actor_kind(who),
            )
        except HibernationError as e:
            raise web.HTTPError(e.status, e.message) from None
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{row['id']}")
        self.write_json(row, status=202)


class _Found(APIHandler):
    async def find(self, id: str) -> dict:
        who = self.require_identity()
        row = await self.gpulab.hibernations.get(id)
        # Another user's hibernation is answered as one that does not exist.
        if row is None or not who.can_act_for(row["user"]):
            raise web.HTTPError(404, f"no hibernation {id!r} of yours")
        return row


class HibernationHandler(_Found):
    async def get(self, id: str):
        self.write_json(await self.find(id))


class WakesHandler(_Found):
    async def post(self, id: str):
        row = await self.find(id)
        if row["state"] not in ("hibernated", "woken"):
            raise web.HTTPError(
                409, f"hibernation {id} is {row['state']}: nothing was saved to wake"
            )
        wake = wake_report(self.json_body())
        names = {k.get("name") for k in row["kernel_states"]}
        if wake["name"] not in names:
            raise web.HTTPError(400, f"hibernation {id} saved no kernel named {wake['name']!r}")
        self.write_json(await self.gpulab.hibernations.woke(row, wake, self.identity.name))


routes = [
    (r"api/v1/hibernations", HibernationsHandler),
    (r"api/v1/hibernations/([A-Za-z0-9-]+)", HibernationHandler),
    (r"api/v1/hibernations/([A-Za-z0-9-]+)/wakes", WakesHandler),
]
