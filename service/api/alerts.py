"""``GET /api/v1/alerts``: what the alert engine (:mod:`gpulab.service.operations.alerts`) fired
and resolved.

``?state=firing|resolved|all`` (default all) and ``?since=<ISO 8601>`` (default:
24 h ago; alerts still firing, or resolved after it). Users see the alerts whose
owner is them; admins (and the service itself) see all, those about shared things
(GPUs, nodes, disks: no owner) too. ``firing`` counts the caller's alerts that
fire now, whatever the filters. Newest first.
"""

from __future__ import annotations

import datetime as dt

from tornado import web

from gpulab.db.operations import list_alerts
from gpulab.service.api.query_args import time_arg
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
            list_alerts, self.gpulab.engine, owner, state, since
        )
        self.write_json({"alerts": alerts, "firing": firing})


routes = [(r"api/v1/alerts", AlertsHandler)]
