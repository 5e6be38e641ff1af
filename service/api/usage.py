"""``GET /api/v1/usage``: GPU time per user, group, kind or pool, as JSON or CSV.

Users see their own use only (by kind or by their groups, their share of
them); admins see everyone's. Time comes from :mod:`gpulab.db.usage`:
released slices from the usage table, held slices up to now. ``bucket=day``
adds a ``day`` column: the same time, cut per UTC calendar day.

``unit=tokens``: the tokens of calls through the OpenAI gateway instead, per user,
model and version (:mod:`gpulab.db.llm_usage`), with the same window and access.
"""

from __future__ import annotations

import csv
import datetime as dt
import io

from tornado import web

from gpulab.db import clock
from gpulab.db.llm_usage import COLUMNS as TOKEN_COLUMNS
from gpulab.db.llm_usage import TokenUsageStore
from gpulab.db.usage import BUCKETS, GROUP_BYS, UsageStore
from gpulab.service.api.query_args import time_arg
from gpulab.service.auth import APIHandler

#: The default window: the last week.
DEFAULT_DAYS = 7


class UsageHandler(APIHandler):
    async def get(self):
        user = self.listed_user("usage")
        unit = self.get_argument("unit", None)
        if unit == "tokens":
            await self.tokens(user)
            return
        if unit not in (None, "gpu_time"):
            raise web.HTTPError(
                400, "unit must be tokens (the OpenAI gateway's), or left out for GPU time"
            )
        group_by = self.get_argument("group_by", "user")
        if group_by not in GROUP_BYS:
            raise web.HTTPError(400, f"group_by must be one of {', '.join(GROUP_BYS)}")
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "csv"):
            raise web.HTTPError(400, "format must be json or csv")
        bucket = self.get_argument("bucket", None) or None
        if bucket is not None and bucket not in BUCKETS:
            choices = " or ".join(BUCKETS)
            raise web.HTTPError(
                400, f"bucket must be {choices}, or left out for one row per {group_by}"
            )
        until = time_arg("until", self.get_argument("until", None)) or clock.utcnow()
        since = time_arg("since", self.get_argument("since", None)) or until - dt.timedelta(
            days=DEFAULT_DAYS
        )
        if since >= until:
            raise web.HTTPError(400, "'since' must be before 'until'")
        groups_of = None
        if group_by == "group":
            settings = await self.gpulab.hub_groups.refresh()
            groups_of = {}
            for name, s in settings.items():
                for member in s["members"]:
                    groups_of.setdefault(member, []).append(name)
        rows = await self.gpulab.db_threads.run(
            UsageStore(self.gpulab.ledger.engine).report,
            since,
            until,
            group_by,
            None if user is None else [user],
            groups_of,
            bucket,
            {g.uuid: g.pool for g in self.gpulab.gpus},
        )
        price, currency = (
            self.gpulab.budget_settings.price_per_gpu_hour,
            self.gpulab.budget_settings.price_currency,
        )
        if price:  # the site set a price: what each row's hours cost
            for r in rows:
                r["cost"] = round(r["gpu_hours"] * price, 2)
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            out = io.StringIO()
            writer = csv.DictWriter(
                out,
                [
                    *(["day"] if bucket else []),
                    group_by,
                    "gpu_hours",
                    *(["cost"] if price else []),
                    "milli_gpu_seconds",
                    "allocations",
                ],
            )
            writer.writeheader()
            writer.writerows(rows)
            self.finish(out.getvalue())
            return
        self.write_json(
            {
                "since": since.isoformat(),
                "until": until.isoformat(),
                "group_by": group_by,
                "bucket": bucket,
                **({"price_per_gpu_hour": price, "currency": currency} if price else {}),
                "rows": rows,
            }
        )

    async def tokens(self, user: str | None) -> None:
        """``unit=tokens``: prompt and completion tokens per user, model and version
        (calls through the OpenAI gateway)."""
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "csv"):
            raise web.HTTPError(400, "format must be json or csv")
        # The rows of calls that just ended are written off the call's path: wait for
        # them, so a call that has answered shows in the report asked for next. First:
        # a row is stamped when it is written, and "now" is the report's end.
        await self.gpulab.deployments.gateway.meter.flush()
        until = time_arg("until", self.get_argument("until", None)) or clock.utcnow()
        since = time_arg("since", self.get_argument("since", None)) or until - dt.timedelta(
            days=DEFAULT_DAYS
        )
        if since >= until:
            raise web.HTTPError(400, "'since' must be before 'until'")
        rows = await self.gpulab.db_threads.run(
            TokenUsageStore(self.gpulab.ledger.engine).report,
            since,
            until,
            None if user is None else [user],
        )
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            out = io.StringIO()
            writer = csv.DictWriter(out, list(TOKEN_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
            self.finish(out.getvalue())
            return
        self.write_json(
            {"since": since.isoformat(), "until": until.isoformat(), "unit": "tokens", "rows": rows}
        )


class BudgetHandler(APIHandler):
    """``GET /api/v1/budget[?user=NAME]``: GPU-hours used and left this period, for the
    user and each group of theirs with a budget (admins may ask about anyone)."""

    async def get(self):
        who = self.require_identity()
        user = self.get_argument("user", who.name)
        if not who.can_act_for(user):
            raise web.HTTPError(403, "you can only ask about your own budget")
        self.write_json(await self.gpulab.budgets.budget_of(user))


routes = [(r"api/v1/usage", UsageHandler), (r"api/v1/budget", BudgetHandler)]
