"""``GET /api/v1/alerts``: what the alert engine (:mod:`gpulab.service.operations.alerts`) fired
and resolved.

``?state=firing|resolved|all`` (default all) and ``?since=<ISO 8601>`` (default:
24 h ago; alerts still firing, or resolved after it). Users see the alerts whose
owner is them; admins (and the service itself) see all, those about shared things
(GPUs, nodes, disks: no owner) too. ``firing`` counts the caller's alerts that
fire now and nobody acknowledged, whatever the filters. Newest first.

``POST /api/v1/alerts/{id}/ack``: the caller has seen the alert (its owner, or an
admin; anyone else gets the 404 of an alert that does not exist). It stops counting
as firing; an alert about an event (a failed job) resolves. Answers the alert.
"""

from __future__ import annotations

import datetime as dt

from tornado import web

from gpulab.db.operations import AlertStore
from gpulab.service.api.query_args import int_arg, time_arg
from gpulab.service.auth import APIHandler
from gpulab.service.operations.alerts import STATES

DEFAULT_HOURS = 24


class AlertsHandler(APIHandler):
    async def get(self):
        who = self.require_identity()
        state = self.get_argument("state", "all")
        if state not in STATES:
            raise web.HTTPError(400, f"'state' must be one of {', '.join(STATES)}, got {state!r}")
        since = time_arg("since", self.get_argument("since", None)) or (
            dt.datetime.now(dt.UTC) - dt.timedelta(hours=DEFAULT_HOURS)
        )
        owner = None if (who.admin or who.internal) else who.name
        alerts, firing = await self.gpulab.db_threads.run(
            AlertStore(self.gpulab.engine).list, owner, state, since
        )
        self.write_json({"alerts": alerts, "firing": firing})


class AlertAckHandler(APIHandler):
    audit_actions = {"POST": "alert.acknowledge"}

    async def post(self, alert_id):
        who = self.require_identity()
        number = int_arg("the alert id", alert_id, None, 1)
        svc = self.gpulab
        row = await svc.db_threads.run(AlertStore(svc.engine).get, number)
        if row is None or not (who.admin or who.internal or row.owner == who.name):
            # Another user's alert is not theirs to know of: the same answer as none.
            raise web.HTTPError(404, f"no alert {number} of yours; %gpulab alerts --all lists them")
        if svc.alerts is None:
            raise web.HTTPError(503, "the alert engine is not running; try again in a moment")
        alert = await svc.alerts.acknowledge(row, who.name)
        await self.audit(
            "alert.acknowledge", f"{row.name} {row.subject}", user=row.owner or who.name
        )
        self.write_json(alert)


routes = [
    (r"api/v1/alerts", AlertsHandler),
    (r"api/v1/alerts/([^/]+)/ack", AlertAckHandler),
]
