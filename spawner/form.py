"""The spawn form: slice sizes with how many can be placed now, and why not."""

from __future__ import annotations

import os
from html import escape

#: Set to "1" by `gpulab up --demo` in the hub's, the servers' and the service's environment.
DEMO_LOGIN_ENV = "GPULAB_DEMO_LOGIN"
DEMO_LOGIN_WARNING = (
    "Demo login: anyone with the shared password can log in as any user. "
    "Restart without --demo for per-user accounts."
)


def demo_login(env=os.environ) -> bool:
    return env.get(DEMO_LOGIN_ENV) == "1"


def _demo_login_html() -> str:
    head, _, rest = escape(DEMO_LOGIN_WARNING).partition(": ")
    return f"<strong>{head}:</strong> " + rest.replace(
        "--demo", '<code class="text-nowrap">--demo</code>'
    )


def render_form(
    availability: dict, demo: bool | None = None, limits: dict[int, str] | None = None
) -> str:
    """HTML for the hub's spawn page from the service's availability answer.

    ``demo`` (default: read from the hub's environment) puts the demo-login
    warning on top; ``limits`` (slice milli -> "cgroup v1: 1 CPU, 2.7 GiB, ...")
    says what each size's server is held to.
    """
    rows = []
    default = next((s["milli"] for s in availability["sizes"] if s["available"] and s["milli"]), 0)
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
            status = escape(s["reason"] or "unavailable")
        rows.append(
            f'<div class="radio{" disabled" if disabled else ""}">'
            f'<label for="{ident}"><input type="radio" name="gpu_milli" id="{ident}" '
            f'value="{milli}"{checked}{disabled}> <strong>{escape(s["label"])}</strong> '
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
    note = (
        f"You hold {held} milli-GPU; your quota is {quota}."
        if quota is not None
        else f"You hold {held} milli-GPU."
    )
    out = availability.get("cordoned") or []
    if out:
        note += (
            f" {len(out)} GPU(s) out of service (cordoned), not counted above: "
            + "; ".join(f"GPU {c['index']} on {c['node']}: {c['reason']}" for c in out)
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
    return (
        f'{warning}<fieldset class="gpulab-slices"><legend>GPU slice</legend>'
        f'{"".join(rows)}<p class="help-block">{escape(note)}{sim}</p></fieldset>'
    )
