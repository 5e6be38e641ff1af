"""``%gpulab alerts [--all]``, ``%gpulab alerts --ack ID`` and the alert line of ``%gpulab``'s
status.

The alerts come from the service (``GET /alerts`` through :mod:`gpulab.client`);
their wording and tables are the dashboard's Alerts tab's
(:mod:`gpulab.widgets.tables`), so a notebook says the same thing in both places.
"""

from __future__ import annotations

import os
import time
from html import escape

from gpulab.client.units import noun

from .rich import Row, failed, muted, show_listing

ALERTS_USAGE = (
    "usage: %gpulab alerts [--all]   (the alerts firing now; "
    "--all: also those resolved in the last 24 h)\n"
    "       %gpulab alerts --ack ID  (you have seen alert #ID: it stops counting as "
    "firing; a failed job's alert resolves)"
)
#: Seconds ``%gpulab`` waits for the alerts before saying it could not get them.
STATUS_TIMEOUT_S = 10.0


def _fetch(state: str, timeout: float | None = None):
    """An ``AlertsModel`` holding the answer, or the one line why there is none."""
    from gpulab.client import Client
    from gpulab.widgets.model import ALERT_HOURS, AlertsModel
    from gpulab.widgets.tables import alerts_error

    m = AlertsModel()
    try:
        client = Client(timeout=timeout) if timeout else Client()
        since = None
        if state == "all":
            since = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - ALERT_HOURS * 3600)
            )
        m.ingest(client.alerts(state=state, since=since), time.time())
    except Exception as e:  # GpuLabError, or a broken answer: a line, never a traceback
        m.fail(alerts_error(e))
    return m


def status_alerts(env: dict[str, str]) -> Row | None:
    """The alerts row of ``%gpulab`` (None outside a server gpulab started)."""
    if not env.get("GPULAB_API_URL"):
        return None
    from gpulab.widgets.tables import alerts_marker, alerts_summary

    m = _fetch("all", timeout=STATUS_TIMEOUT_S)
    summary = alerts_summary(m)
    if m.error:  # "alerts are not available: ...", a line of its own
        text = summary[:1].upper() + summary[1:]
        return Row(text, "Alerts", failed(summary.removeprefix("alerts are ")))
    worst = m.worst()
    if not m.firing or worst is None:
        return Row.of("Alerts", summary)
    names = summary.partition(": ")[2]
    return Row(
        f"Alerts: [{worst}] {summary}  (%gpulab alerts lists them)",
        "Alerts",
        f"{alerts_marker(m)} {escape(names)} {muted('(%gpulab alerts lists them)')}",
    )


def alerts(line: str):
    """The ``%gpulab alerts [--all]`` subcommand: the alerts as a table."""
    from gpulab.widgets.tables import EMPTY_ALERTS, alerts_line, alerts_tables, alerts_text

    args = line.split()
    if args[:1] == ["--ack"]:
        return acknowledge(args[1:])
    extra = [a for a in args if a != "--all"]
    if extra:
        print(f"unknown {noun(len(extra), 'argument')} {' '.join(extra)}\n{ALERTS_USAGE}")
        return None
    every = bool(args)
    m = _fetch("all" if every else "firing")
    if m.error:
        print(m.error)
        return None
    if not m.alerts:
        print(
            EMPTY_ALERTS
            if every
            else "No alerts firing (%gpulab alerts --all also lists those resolved "
            "in the last 24 h)"
        )
        return None
    me = os.environ.get("JUPYTERHUB_USER")
    head = alerts_line(m)
    if m.firing_alerts():
        head += f'<div style="font-size:12px">{escape(ACK_HINT)}</div>'
    print_hint = "\n" + ACK_HINT if m.firing_alerts() else ""
    show_listing(
        {
            "text/plain": alerts_text(m, me) + print_hint,
            "text/html": f'<div style="font-size:12px">{head}</div>{alerts_tables(m, me)}',
        }
    )
    return None


ACK_HINT = "seen one? %gpulab alerts --ack ID (the # in its alert column)"


def acknowledge(args: list[str]):
    """``%gpulab alerts --ack ID``: the alert is seen (its owner's, or an admin's)."""
    from gpulab.client import Client, GpuLabError

    if len(args) != 1 or not args[0].lstrip("#").isdigit():
        print(f"--ack takes one alert id, such as --ack 12\n{ALERTS_USAGE}")
        return None
    alert_id = int(args[0].lstrip("#"))
    try:
        a = Client().acknowledge_alert(alert_id)
    except GpuLabError as e:
        print(f"could not acknowledge alert #{alert_id}: {e}")
        return None
    what = f"{a['name']} #{a['id']} ({a['subject_kind']} {a['subject']})"
    if a["state"] == "resolved":
        print(f"acknowledged {what}: resolved")
    else:
        print(
            f"acknowledged {what}: it still fires until its cause is gone, "
            f"but no longer counts as firing"
        )
    return None
