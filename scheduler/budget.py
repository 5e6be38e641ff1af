"""GPU-hour budgets per period, per user and per group, and their cost.

A *quota* (:mod:`.quota`) caps what a user holds at once; a *budget* caps what they
(or a group, all members together) use over a period: a calendar month by default,
as Run:ai's and OpenCost's per-team budgets do. Use is read from the same ledger as
``GET /usage`` (:meth:`gpulab.db.usage.UsageStore.report`: released slices plus slices
still held, up to now), so the figure people see and the one that refuses them agree.

A user or a group at or over its budget is refused new GPU work (a server with a
GPU, a job, a deployment) until the next period, unless an admin lets the group
overdraw. Work already running is not stopped. ``None`` means no budget.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from gpulab.db import clock
from gpulab.db.usage import UsageStore

#: The periods a budget may run over; each starts at 00:00 UTC.
PERIODS = ("month", "week", "day")


class BudgetExceeded(Exception):
    """A user or one of their groups has used its GPU-hours for this period."""


def period_window(now: dt.datetime, period: str = "month") -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` of the period ``now`` is in: the calendar month, the ISO week
    (from Monday) or the day, in UTC."""
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, got {period!r}")
    day = dt.datetime.combine(now.astimezone(dt.UTC).date(), dt.time(), dt.UTC)
    if period == "day":
        return day, day + dt.timedelta(days=1)
    if period == "week":
        start = day - dt.timedelta(days=day.weekday())
        return start, start + dt.timedelta(days=7)
    start = day.replace(day=1)
    end = (start + dt.timedelta(days=32)).replace(day=1)
    return start, end


@dataclass
class Budgets:
    """What the site set: GPU-hours per period and the price of one."""

    period: str = "month"
    default_user_hours: float | None = None
    user_hours: Mapping[str, float] = field(default_factory=dict)
    group_hours: Mapping[str, float] = field(default_factory=dict)
    #: Groups an admin lets go past their budget (their use is still shown).
    overdraft_groups: frozenset[str] = frozenset()
    price_per_gpu_hour: float = 0.0
    currency: str = "USD"

    def user_budget(self, user: str) -> float | None:
        return self.user_hours.get(user, self.default_user_hours)

    def cost(self, hours: float) -> float | None:
        """What ``hours`` GPU-hours cost; None where the site set no price."""
        return round(hours * self.price_per_gpu_hour, 2) if self.price_per_gpu_hour else None

    def any_set(self) -> bool:
        return self.default_user_hours is not None or bool(self.user_hours or self.group_hours)


def _line(name: str, budget: float | None, used: float, cost: float | None) -> dict:
    left = None if budget is None else round(max(0.0, budget - used), 4)
    return {
        "name": name,
        "budget_gpu_hours": budget,
        "used_gpu_hours": round(used, 4),
        "left_gpu_hours": left,
        "cost": cost,
    }


def budget_status(
    engine: Engine,
    budgets: Budgets,
    user: str,
    groups: Mapping[str, Iterable[str]],
    now: dt.datetime | None = None,
) -> dict:
    """Where ``user`` stands this period: their own line and one per group of theirs
    that has a budget (``groups``: group -> members, the user's groups only).

    ``{"period", "since", "until", "price_per_gpu_hour", "currency", "user": {...},
    "groups": [{..., "overdraft"}], "over": [names of lines at or past their budget
    that are not allowed to overdraw]}``; each line ``{"name", "budget_gpu_hours",
    "used_gpu_hours", "left_gpu_hours", "cost"}``. Reads the database: call it in a
    thread.
    """
    now = now or clock.utcnow()
    since, until = period_window(now, budgets.period)
    members = {g: set(m) | {user} for g, m in groups.items() if g in budgets.group_hours}
    everyone = set().union({user}, *members.values())
    used = UsageStore(engine)
    rows = used.report(since, min(until, now), "user", everyone) if now > since else []
    hours = {r["user"]: r["gpu_hours"] for r in rows}
    mine = hours.get(user, 0.0)
    out_user = _line(user, budgets.user_budget(user), mine, budgets.cost(mine))
    out_groups = []
    for name in sorted(members):
        used = sum(hours.get(m, 0.0) for m in members[name])
        line = _line(name, budgets.group_hours[name], used, budgets.cost(used))
        line["overdraft"] = name in budgets.overdraft_groups
        out_groups.append(line)
    over = [
        line["name"]
        for line in [out_user, *out_groups]
        if line["budget_gpu_hours"] is not None
        and line["used_gpu_hours"] >= line["budget_gpu_hours"]
        and not line.get("overdraft")
    ]
    return {
        "period": budgets.period,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "price_per_gpu_hour": budgets.price_per_gpu_hour or None,
        "currency": budgets.currency,
        "user": out_user,
        "groups": out_groups,
        "over": over,
    }


def hours_words(hours: float) -> str:
    """1.0 -> "1", 2.5 -> "2.5", 0.3333 -> "0.33"."""
    return f"{hours:.2f}".rstrip("0").rstrip(".")


def check(status: dict, contact: str) -> None:
    """Raise :class:`BudgetExceeded` with the figure and who can raise it when
    ``status`` (from :func:`budget_status`) is over a budget."""
    if not status["over"]:
        return
    name = status["over"][0]
    user = status["user"]
    line = next((g for g in status["groups"] if g["name"] == name), None)
    whose, its = (f"Group {name}", "its") if line is not None else (name, "their")
    line = line or user
    until = status["until"][:10]
    raise BudgetExceeded(
        f"{whose} has used {hours_words(line['used_gpu_hours'])} of {its} "
        f"{hours_words(line['budget_gpu_hours'])} GPU-hours this {status['period']} "
        f"(until {until}); new GPU work is refused until then. To raise it, ask {contact}."
    )
