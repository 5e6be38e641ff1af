"""The spawn form: slice sizes with how many can be placed now, and why not."""

from __future__ import annotations

import datetime as dt
import os
import re
from html import escape

from gpulab.scheduler.slices import MILLI_PER_GPU, label

from .placement import gib

#: Set to "1" by `gpulab up --demo` in the hub's, the servers' and the service's environment.
DEMO_LOGIN_ENV = "GPULAB_DEMO_LOGIN"
DEMO_LOGIN_WARNING = (
    "Demo login: anyone with the shared password can log in as any user. "
    "Restart without --demo for per-user accounts."
)


def demo_login(env=os.environ) -> bool:
    return env.get(DEMO_LOGIN_ENV) == "1"


#: The Unix account every user's code runs as, where users have no accounts of their
#: own (`gpulab up --single-account`, or c.UserAccounts.enabled = False); set by the
#: hub's configuration in its own and the servers' environment.
SINGLE_ACCOUNT_ENV = "GPULAB_SINGLE_ACCOUNT"
SINGLE_ACCOUNT_WARNING = (
    "Single account: every user's code runs as {account}; users are not separated on this host."
)


def single_account(env=os.environ) -> str:
    """The shared account's name, or "" where each user has an account of their own."""
    return env.get(SINGLE_ACCOUNT_ENV, "")


def _single_account_html(account: str) -> str:
    head, _, rest = SINGLE_ACCOUNT_WARNING.partition(": ")
    account_html = f'<code class="text-nowrap">{escape(account)}</code>'
    return f"<strong>{escape(head)}:</strong> " + escape(rest).replace("{account}", account_html)


def _demo_login_html() -> str:
    head, _, rest = escape(DEMO_LOGIN_WARNING).partition(": ")
    return f"<strong>{head}:</strong> " + rest.replace(
        "--demo", '<code class="text-nowrap">--demo</code>'
    )


_MILLI_AMOUNT = re.compile(r"(\d+) milli-GPUs?")


def in_fractions(text: str) -> str:
    """The service's reasons say amounts in milli-GPU; people read fractions."""
    return _MILLI_AMOUNT.sub(lambda m: label(int(m.group(1))), text)


def size_detail(milli: int, inventory: dict | None) -> str:
    """What a size gives: ``A100-80GB · 20 GiB`` (the cards it fits on now; every
    card when none has room), ``A100-80GB · 20 GiB or T4-16GB · 4 GiB`` when the
    cards differ. Empty for no GPU or no inventory."""
    if not milli or not inventory:
        return ""
    cards = [
        g
        for n in inventory.get("nodes", [])
        for g in n.get("gpus", [])
        if not g.get("cordoned") and not g.get("mig_parent")
    ]
    share = min(milli, MILLI_PER_GPU)
    count = max(1, milli // MILLI_PER_GPU)
    room = [g for g in cards if MILLI_PER_GPU - int(g.get("allocated_milli") or 0) >= share]
    kinds: dict[str, int] = {}
    for g in room or cards:
        kinds.setdefault(str(g.get("model") or "GPU"), int(g.get("memory_mib") or 0))
    return " or ".join(
        f"{model} · {gib(memory * share // MILLI_PER_GPU * count)}"
        for model, memory in kinds.items()
    )


def size_title(size: dict, inventory: dict | None) -> str:
    """``1/4 GPU · A100-80GB · 20 GiB``; ``no GPU``."""
    name = size.get("label") or label(size["milli"])
    detail = size_detail(size["milli"], inventory)
    return f"{name} · {detail}" if detail else name


#: A size that cannot be placed now reads as such, not only by its greyed button.
_FORM_STYLE = (
    "<style>"
    ".gpulab-slices .radio.disabled label{color:#777;cursor:not-allowed}"
    ".gpulab-slices .radio.disabled .gpulab-size{text-decoration:line-through}"
    ".gpulab-slices .radio.disabled .gpulab-status{color:#a94442 !important}"
    "</style>"
)


def ran_since(row: dict, last_activity: dt.datetime | None) -> bool:
    """Has the server run since this hibernation stopped it? ``last_activity`` is the
    hub's for the server (naive UTC; the hub sets it at every start and stop): later
    than the hibernation's end, the server started again (and, not running now, was
    stopped again). Compared to the second, as the service keeps ``finished``."""
    finished = row.get("finished")
    if last_activity is None or not finished:
        return False
    if last_activity.tzinfo is not None:
        last_activity = last_activity.astimezone(dt.UTC).replace(tzinfo=None)
    ended = dt.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%SZ")
    return last_activity.replace(microsecond=0) > ended


def hibernation_words(row: dict, stopped_since: bool, server: str = "") -> tuple[str, str]:
    """What a stopped server's latest hibernation (state ``hibernated``: a notebook
    has not woken yet) means now, true either way: hibernated and not started since,
    or started again and stopped since (a plain stop), when the notebooks not opened
    meanwhile still wait. (What the server is, what to do.)"""
    name = f"Server {server}" if server else "Your server"
    if stopped_since:
        when = f"{row['finished'][11:16]} UTC" if row.get("finished") else "earlier"
        return (
            f"{name} is stopped.",
            f"The notebooks it hibernated at {when} that were not opened since still "
            "have their variables: start it and open them.",
        )
    return (
        f"{name} is {row['summary']}.",
        "Start it at any size (or with no GPU) and open your notebooks: each gets its "
        "variables back.",
    )


def hibernation_note(row: dict, stopped_since: bool = False) -> str:
    """The spawn form's line about a hibernated server (a row of ``GET /hibernations``)."""
    head, rest = hibernation_words(row, stopped_since)
    return (
        '<div class="alert alert-info gpulab-hibernated" role="status">'
        f"<strong>{escape(head)}</strong> {escape(rest)}</div>"
    )


def _hours(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def budget_words(budget: dict) -> str:
    """GPU-hours used and left this period, yours and your groups': ``This month: 3.5
    GPU-hours used, 6.5 left of your 10; group students: 8 used, 2 left of 10. Cost so
    far: 8.75 USD.`` (``budget``: the service's ``/budget`` answer)."""

    def line(b: dict, whose: str, used_unit: str = "") -> str:
        used = _hours(b["used_gpu_hours"]) + used_unit
        if b["budget_gpu_hours"] is None:
            return f"{used} used"
        left = _hours(b["left_gpu_hours"])
        text = f"{used} used, {left} left of {whose} {_hours(b['budget_gpu_hours'])}"
        return text + (" (may overdraw)" if b.get("overdraft") else "")

    me = budget["user"]
    parts = [line(me, "your", " GPU-hours")]
    parts += [f"group {g['name']}: {line(g, 'its')}" for g in budget["groups"]]
    text = f"This {budget['period']}: " + "; ".join(parts) + "."
    if me.get("cost") is not None:
        text += f" Cost so far: {me['cost']:.2f} {budget['currency']}"
        text += f" ({budget['price_per_gpu_hour']:g} {budget['currency']} per GPU-hour)."
    return text


def render_form(
    availability: dict,
    demo: bool | None = None,
    limits: dict[int, str] | None = None,
    inventory: dict | None = None,
    shared_account: str | None = None,
    last: int | None = None,
    hibernated: dict | None = None,
    environments: str = "",
) -> str:
    """HTML for the hub's spawn page from the service's availability answer.

    ``demo`` (default: read from the hub's environment) puts the demo-login
    warning on top, ``shared_account`` (the same) the single-account one;
    ``limits`` (slice milli -> "up to 1 CPU and 2.7 GiB of memory") says what each
    size's server is held to; ``inventory`` (the service's
    ``/inventory``) names the GPU model and memory each size gives; ``last`` (the
    size of the user's last server) is chosen when it can be placed now;
    ``hibernated`` (the server's latest hibernation, when its kernels wait to wake)
    is said on top. ``availability["budget"]`` (GPU-hours used and left this period)
    is said under the sizes; over it, the GPU sizes are disabled and the refusal said
    on top. ``environments`` (the environments' fieldset) follows the sizes.
    """
    rows = []
    budget = availability.get("budget")
    refusal = (budget or {}).get("refusal")
    if refusal:  # over budget: only a server without a GPU can start
        availability = dict(availability)
        availability["sizes"] = [
            s if not s["milli"] else {**s, "available": False, "reason": "over budget"}
            for s in availability["sizes"]
        ]
    open_sizes = [s["milli"] for s in availability["sizes"] if s["available"]]
    default = last if last in open_sizes else next((m for m in open_sizes if m), 0)
    for s in availability["sizes"]:
        milli = s["milli"]
        ident = f"gpulab-slice-{milli}"
        disabled = "" if s["available"] else " disabled"
        checked = " checked" if milli == default else ""
        if milli == 0:
            status = "always available"
        elif s["available"]:
            status = f"{s['count']} can be placed now"
        else:
            status = "unavailable: " + escape(in_fractions(s["reason"] or "no room now"))
        rows.append(
            f'<div class="radio{" disabled" if disabled else ""}">'
            f'<label for="{ident}"><input type="radio" name="gpu_milli" id="{ident}" '
            f'value="{milli}"{checked}{disabled}> '
            f'<strong class="gpulab-size">{escape(size_title(s, inventory))}</strong> '
            f'<span class="text-muted gpulab-status">({status})</span>'
            + (
                f'<br><small class="text-muted gpulab-limits">{escape(limits[milli])}</small>'
                if limits and milli in limits
                else ""
            )
            + "</label></div>"
        )
    quota = availability.get("quota_milli")
    held = availability.get("held_milli", 0)
    note = f"You hold {label(held) if held else 'no GPU'}"
    if quota is not None:
        note += f"; your quota is {label(quota) if quota else '0 GPUs'}"
    note += "."
    out = availability.get("cordoned") or []
    if out:
        note += (
            f" {label(len(out) * MILLI_PER_GPU)} out of service (cordoned), not counted above: "
            + "; ".join(f"GPU #{c['index']} on {c['node']}: {c['reason']}" for c in out)
            + "."
        )
    sim = (
        " <em>These GPUs are simulated: nothing is enforced.</em>"
        if availability.get("simulated")
        else ""
    )
    if demo is None:
        demo = demo_login()
    warning = (
        f'<div class="alert alert-warning gpulab-demo-login" role="alert">'
        f"{_demo_login_html()}</div>"
        if demo
        else ""
    )
    if shared_account is None:
        shared_account = single_account()
    if hibernated:
        warning += hibernation_note(hibernated, bool(hibernated.get("stopped_since")))
    if refusal:
        warning += (
            f'<div class="alert alert-danger gpulab-budget-refusal" role="alert">'
            f"{escape(refusal)}</div>"
        )
    if shared_account:
        warning += (
            f'<div class="alert alert-warning gpulab-single-account" role="alert">'
            f"{_single_account_html(shared_account)}</div>"
        )
    return (
        f"{warning}{_FORM_STYLE}"
        f'<fieldset class="gpulab-slices"><legend>GPU slice</legend>'
        f'{"".join(rows)}<p class="help-block">{escape(note)}{sim}</p>'
        + (
            f'<p class="help-block gpulab-budget">{escape(budget_words(budget))}</p>'
            if budget
            else ""
        )
        + "</fieldset>"
        + environments
    )
