"""GPU-hours used and left this period (``GET /budget``), and the same in words.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has the
same method, blocking::

    gl.budget()          # {"period": "month", "user": {...}, "groups": [...], ...}
    gl.budget("alice")   # admins: another user's
"""

from __future__ import annotations


def hours(value: float) -> str:
    """2.5 -> "2.5", 0.3333 -> "0.33", 2.0 -> "2"."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _line(b: dict, whose: str, unit: str = "") -> str:
    used = hours(b["used_gpu_hours"]) + unit
    if b["budget_gpu_hours"] is None:
        return f"{used} used"
    text = f"{used} used, {hours(b['left_gpu_hours'])} left of {whose} "
    text += hours(b["budget_gpu_hours"])
    return text + (" (may overdraw)" if b.get("overdraft") else "")


def budget_text(status: dict) -> str:
    """``This month (until 2027-01-01): 3.5 GPU-hours used, 6.5 left of your 10; group
    students: 8 used, 2 left of its 10; cost so far 8.75 EUR`` (the spawn form's words)."""
    parts = [_line(status["user"], "your", " GPU-hours")]
    parts += [f"group {g['name']}: {_line(g, 'its')}" for g in status["groups"]]
    cost = status["user"].get("cost")
    if cost is not None:
        parts.append(f"cost so far {cost:.2f} {status['currency']}")
    return f"This {status['period']} (until {status['until'][:10]}): " + "; ".join(parts)


class BudgetAPI:
    async def budget(self, user: str | None = None) -> dict:
        """Where you stand against the site's GPU-hour budgets this period: ``{"period",
        "since", "until", "user": {"budget_gpu_hours", "used_gpu_hours",
        "left_gpu_hours", "cost"}, "groups": [... "overdraft"], "over", "refusal",
        "price_per_gpu_hour", "currency", "set"}``. ``refusal`` is what new GPU work is
        refused with now (None: it is not)."""
        return await self.request("GET", "/budget", query={"user": user} if user else None)
