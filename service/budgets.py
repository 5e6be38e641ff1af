"""GPU-hour budgets: the site's settings, and where a user stands against them.

The settings live on :class:`BudgetSettings`, a part of the service set as
``c.BudgetSettings.<name>``; the service builds :class:`UserBudgets` from them
(:meth:`BudgetSettings.budget_config`) and the hub's API, and the routes ask it
(``GpuLabService.budgets``). Hub groups carry a budget as the property
``gpulab_budget_gpu_hours`` (and ``gpulab_budget_overdraft: true``) an admin sets on
the hub's admin page; the config wins. The arithmetic is :mod:`gpulab.scheduler.budget`.

Who is told about it: the spawn form (``GET /availability``'s ``budget``), the lab's
status bar and ``%gpulab`` (``GET /budget``); who is refused: a server with a GPU
(``POST /allocations``), a job (``POST /jobs``) and a deployment (``POST /deployments``).
"""

from __future__ import annotations

from dataclasses import dataclass

from traitlets import Dict, Float, List, Unicode, validate
from traitlets.config import Configurable

from gpulab.scheduler.budget import PERIODS, BudgetExceeded, Budgets, budget_status, check

#: Hub group properties an admin may set on the hub's admin page.
GROUP_BUDGET_PROPERTY = "gpulab_budget_gpu_hours"
GROUP_OVERDRAFT_PROPERTY = "gpulab_budget_overdraft"

__all__ = ["BudgetConfig", "BudgetExceeded", "BudgetSettings", "UserBudgets"]


def _hours(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


class BudgetSettings(Configurable):
    budget_period = Unicode(
        "month",
        help="""The period GPU-hour budgets run over: "month" (calendar month, UTC),
        "week" (from Monday) or "day". Use is counted afresh from each period's start.

        c.BudgetSettings.budget_period = "week"
        """,
    ).tag(config=True)

    @validate("budget_period")
    def _check_period(self, proposal):
        if proposal.value not in PERIODS:
            raise ValueError(
                f"c.BudgetSettings.budget_period must be one of {', '.join(PERIODS)}, "
                f"not {proposal.value!r}"
            )
        return proposal.value

    default_user_budget_gpu_hours = Float(
        None,
        allow_none=True,
        help="""GPU-hours each user may use per period (servers, jobs and deployments
        together; a 1/4 GPU held for 4 hours is one GPU-hour), unless set per user.
        None: no budget per user.

        c.BudgetSettings.default_user_budget_gpu_hours = 50
        """,
    ).tag(config=True)

    user_budget_gpu_hours = Dict(
        help="""Per-user GPU-hour budgets per period.

        c.BudgetSettings.user_budget_gpu_hours = {"alice": 200}
        """,
    ).tag(config=True)

    group_budget_gpu_hours = Dict(
        help="""Per-group GPU-hour budgets per period, all members together. A hub
        group's property `gpulab_budget_gpu_hours` sets it too; this setting wins. A
        group at its budget is refused new GPU work until the next period (running
        work goes on), unless it may overdraw (group_budget_overdraft).

        c.BudgetSettings.group_budget_gpu_hours = {"students": 500}
        """,
    ).tag(config=True)

    group_budget_overdraft = List(
        Unicode(),
        help="""Groups an admin lets go past their GPU-hour budget: their use and
        what is left are still shown, but nothing is refused. A hub group's property
        `gpulab_budget_overdraft: true` does the same.

        c.BudgetSettings.group_budget_overdraft = ["vision-lab"]
        """,
    ).tag(config=True)

    price_per_gpu_hour = Float(
        0.0,
        help="""What one GPU-hour costs (in price_currency): `GET /usage` then reports
        `cost` beside the hours, and the spawn form, the lab's status bar and %gpulab
        say what the period's use cost. 0: no price, no cost shown.

        c.BudgetSettings.price_per_gpu_hour = 2.5
        """,
    ).tag(config=True)

    price_currency = Unicode(
        "USD",
        help="""The currency of price_per_gpu_hour, as shown beside each cost.

        c.BudgetSettings.price_currency = "EUR"
        """,
    ).tag(config=True)

    budget_contact = Unicode(
        "",
        help="""Who raises a budget, as a refusal names them ("ask ..."). Empty: the
        hub's admins by name.

        c.BudgetSettings.budget_contact = "gpu-admins@example.org"
        """,
    ).tag(config=True)

    def budget_config(self) -> BudgetConfig:
        """These settings as the budgets part (:class:`UserBudgets`) takes them."""
        return BudgetConfig(
            period=self.budget_period,
            default_user_hours=self.default_user_budget_gpu_hours,
            user_hours={k: float(v) for k, v in self.user_budget_gpu_hours.items()},
            group_hours={k: float(v) for k, v in self.group_budget_gpu_hours.items()},
            overdraft_groups=frozenset(self.group_budget_overdraft),
            price_per_gpu_hour=self.price_per_gpu_hour,
            currency=self.price_currency,
            contact=self.budget_contact,
        )


@dataclass(frozen=True)
class BudgetConfig:
    """The site's budget settings (:class:`BudgetSettings`), read once at the start."""

    period: str
    default_user_hours: float | None
    user_hours: dict[str, float]
    group_hours: dict[str, float]
    overdraft_groups: frozenset[str]
    price_per_gpu_hour: float
    currency: str
    contact: str


class UserBudgets:
    """Where each user stands against the budgets, and the refusal of GPU work over
    them. Given what it reads by name: the hub's API (group properties, admins), the
    ledger's database and the threads that query it, and the settings."""

    def __init__(self, *, hub, engine, db_threads, config: BudgetConfig):
        self.hub = hub
        self.engine = engine
        self.db_threads = db_threads
        self.config = config

    async def budgets(self) -> tuple[Budgets, dict[str, set[str]]]:
        """The budgets now (config over hub group properties) and every hub group's
        members."""
        config = self.config
        groups: dict[str, set[str]] = {}
        group_hours: dict[str, float] = {}
        overdraft = set(config.overdraft_groups)
        for g in await self.hub.groups():
            props = g.get("properties") or {}
            groups[g["name"]] = set(g.get("users") or [])
            hours = _hours(props.get(GROUP_BUDGET_PROPERTY))
            if hours is not None:
                group_hours[g["name"]] = hours
            if props.get(GROUP_OVERDRAFT_PROPERTY) is True:
                overdraft.add(g["name"])
        group_hours.update(config.group_hours)
        budgets = Budgets(
            period=config.period,
            default_user_hours=config.default_user_hours,
            user_hours=dict(config.user_hours),
            group_hours=group_hours,
            overdraft_groups=frozenset(overdraft),
            price_per_gpu_hour=config.price_per_gpu_hour,
            currency=config.currency,
        )
        return budgets, groups

    async def budget_of(self, user: str) -> dict:
        """Where ``user`` stands this period (:func:`~gpulab.scheduler.budget.budget_status`),
        plus ``"set"``: whether any budget applies to them, and ``"refusal"``: the words
        new GPU work is refused with now (None: it is not)."""
        budgets, groups = await self.budgets()
        theirs = {name: members for name, members in groups.items() if user in members}
        status = await self.db_threads.run(budget_status, self.engine, budgets, user, theirs)
        status["set"] = status["user"]["budget_gpu_hours"] is not None or bool(status["groups"])
        status["refusal"] = None
        if status["over"]:  # the words new GPU work is refused with, said before it is sent
            try:
                check(status, await self.contact_words())
            except BudgetExceeded as e:
                status["refusal"] = str(e)
        return status

    async def contact_words(self) -> str:
        if self.config.contact:
            return self.config.contact
        admins = await self.hub.admins()
        if admins:
            return f"an admin ({', '.join(admins)})"
        return "an admin (c.BudgetSettings.group_budget_gpu_hours)"

    async def refuse_over_budget(self, user: str, gpu_milli: int) -> None:
        """Raise :class:`BudgetExceeded` when ``user`` (or a group of theirs) has used
        its budget and asks for GPU work; work without a GPU costs no GPU-hours."""
        if not gpu_milli:
            return
        status = await self.budget_of(user)
        if status["refusal"]:
            raise BudgetExceeded(status["refusal"])
