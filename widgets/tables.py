"""Small HTML pieces beside the figures: status lines and tables, from a ``TelemetryModel``.

Rows are shown as served: a user's answer only holds their own slices, so the
"held by" column names only them; an admin's holds everyone's. The same goes for
alerts: a user's are about their own things, an admin's also name the owner.
The alert pieces here serve the dashboard's Alerts tab and ``%gpulab`` alike
(``alerts_summary``, ``alerts_text``: plain text for the magic).
"""

from __future__ import annotations

import math
import time
from html import escape

from gpulab.client.units import gpu_label, holders, plural

from .model import ALERT_HOURS, USAGE_DAYS, AlertsModel, TelemetryModel, UsageModel

#: Which telemetry sources each tab draws (for its "missing" line).
TAB_SOURCES = {
    "Cluster": ("gpu",),
    "Cache": ("cache",),
    "Network": ("nic", "rdma"),
    "Jobs": (),
    "Alerts": (),
    "Usage": (),
}

_TABLE = (
    '<table class="gpulab-table" style="border-collapse:collapse;font-size:12px;'
    'margin:4px 12px 8px 0;display:inline-table;vertical-align:top">'
)
_CELL = 'style="border:1px solid #ddd;padding:2px 6px;text-align:{}"'


def _fmt(value, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if value is None or isinstance(value, bool):
        return "—"
    try:
        x = float(value) * scale
    except (TypeError, ValueError):
        return escape(str(value))
    if math.isnan(x):
        return "—"
    return f"{x:,.{digits}f}{unit}"


def table(caption: str, headers: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escape text before passing it)."""
    head = "".join(f"<th {_CELL.format('left')}>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td {_CELL.format('left')}>{c}</td>" for c in row) + "</tr>"
        for row in rows
    )
    if not rows:
        body = f'<tr><td {_CELL.format("left")} colspan="{len(headers)}">none</td></tr>'
    return (
        f'{_TABLE}<caption style="text-align:left;font-weight:600">{escape(caption)}'
        f"</caption><tr>{head}</tr>{body}</table>"
    )


#: The notice box of a tab whose charts have nothing to draw (shown once, above them).
_NOTICE = (
    '<div class="gpulab-notice" data-source="{source}" style="margin:2px 0 6px;'
    "padding:8px 12px;border:1px solid #f0d9b5;background:#fff8ec;color:#5b3a00;"
    'font-size:13px;line-height:1.45;max-width:900px">{text}</div>'
)


def _why(by_node: dict[str, str]) -> str:
    """``<reason>`` for one node (it is "this machine"), else ``node: reason; ...``."""
    if len(by_node) == 1:
        return escape(next(iter(by_node.values())))
    return "; ".join(f"{escape(n)}: {escape(r)}" for n, r in by_node.items())


def notice(m: TelemetryModel, tab: str) -> str:
    """The one notice (HTML) a tab shows instead of empty charts, or ''.

    Cluster: no node reports GPU telemetry; Cache: no node's dataset cache reports.
    The reason is each node's, in full (the agent's words), said once.
    """
    if not m.answers:
        return ""
    if tab == "Cluster" and not m.gpus:
        missing = m.missing_sources("gpu").get("gpu") or {}
        where = "on this machine" if len(m.missing) <= 1 else "on any node"
        why = f": {_why(missing)}" if missing else ""
        return _NOTICE.format(
            source="gpu",
            text=f"<b>No GPU telemetry {where}</b>{why}. "
            "GPU charts appear when a node agent reports NVML data.",
        )
    if tab == "Cache" and not m.cache:
        missing = m.missing_sources("cache").get("cache") or {}
        where = "on this machine" if len(m.missing) <= 1 else "on any node"
        why = f": {_why(missing)}" if missing else ""
        # The service's reason usually says already when the cache appears.
        when = (
            ""
            if "gpulab.cache" in why
            else (" Cache charts appear when a process reads data through gpulab.cache.")
        )
        return _NOTICE.format(
            source="cache", text=f"<b>No dataset cache reports {where}</b>{why}.{when}"
        )
    return ""


def status_line(m: TelemetryModel, tab: str, error: str | None) -> str:
    """This tab's notice (no data at all), or which sources some nodes lack and why; the
    last fetch error; when it last updated."""
    parts = []
    box = notice(m, tab)
    for source, by_node in m.missing_sources(*TAB_SOURCES[tab]).items():
        if box:  # the notice says it already
            break
        for node, reason in by_node.items():
            parts.append(f"<b>{escape(source)} missing on {escape(node)}</b>: {escape(reason)}")
    if tab == "Cluster" and any(
        g.get("simulated") for n in m.inventory.get("nodes") or [] for g in n.get("gpus") or []
    ):
        parts.append(
            "GPUs are <b>simulated</b> (declared for demos and tests; "
            "slices are tracked, nothing is measured)"
        )
    if error:
        parts.insert(
            0,
            f'<span style="color:#b00020"><b>update failed</b> (retrying): {escape(error)}</span>',
        )
    when = (
        time.strftime("%H:%M:%S", time.localtime(m.now))
        if m.now and not math.isnan(m.now)
        else "never"
    )
    if tab == "Jobs":
        parts.append(f"{plural(len(m.jobs), 'job')} you may see" if m.jobs else "no jobs to show")
    updated = f"updated {when}; {m.points()} points"
    if tab == "Usage":
        parts.append(usage_line(m.usage))
        updated = f"GPU-hours updated {_clock(m.usage.fetched)}"
    if tab == "Alerts":
        parts.append(alerts_line(m.alerts))
        updated = f"alerts updated {_clock(m.alerts.fetched)}"
    lines = "<br>".join(parts) or ("" if box else "all sources reporting")
    return (
        f'<div class="gpulab-status" data-tab="{tab}" data-points="{m.points()}" '
        f'style="font-size:12px;line-height:1.4">{box}{lines}'
        f'{"<br>" if lines else ""}<span style="color:#666">{updated}</span></div>'
    )


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "never"


def usage_error(err: BaseException) -> str:
    """One short line for the Usage tab: why there are no GPU-hours (never a traceback)."""
    status = getattr(err, "status", None)
    if status == 404:
        return (
            "GPU-hours are not available: this gpulab service has no usage report "
            "(404, older than GPU-hours accounting)"
        )
    text = " ".join(str(err).split()) or type(err).__name__
    if len(text) > 160:
        text = text[:159] + "…"
    return (
        f"GPU-hours are not available ({status}): {text}"
        if status
        else (f"GPU-hours are not available: {text}")
    )


def usage_line(u: UsageModel) -> str:
    """The Usage tab's own line (HTML): the error, the empty message, or the total."""
    if u.error:
        return f'<span style="color:#b00020">{escape(u.error)}</span>'
    if u.fetched is None:
        return "GPU-hours not fetched yet"
    if u.empty:
        return f"<b>No GPU time used in the last {USAGE_DAYS} days</b>"
    return f"<b>{_hours(u.total_hours)} GPU-hours</b> used in the last {USAGE_DAYS} days"


def _hours(value: float) -> str:
    if 0 < value < 0.005:
        return "&lt;0.01"
    return f"{value:,.2f}"


def _holders(m: TelemetryModel, uuid: str, me: str | None) -> str:
    """One entry per holder of the GPU's slices, summed: ``you · 1/4 GPU, bob · 1/2 GPU``."""
    mine = [s for s in m.slices if s.get("gpu_uuid") == uuid]
    return ", ".join(_nowrap(escape(h)) for h in holders(mine, me))


def _held(milli) -> str:
    """The share of a GPU held, as people read it: ``1/4 GPU``; ``—`` for none."""
    try:
        return "—" if not milli else escape(gpu_label(int(milli)))
    except (TypeError, ValueError):
        return "—"


def cluster_tables(m: TelemetryModel, me: str | None) -> str:
    rows = []
    for node in m.inventory.get("nodes") or []:
        measured = {
            g.get("uuid"): g for g in (m.latest.get(node.get("name")) or {}).get("gpus") or []
        }
        for g in node.get("gpus") or []:
            s = measured.get(g.get("uuid")) or {}
            used = s.get("memory_used_bytes")
            rows.append(
                [
                    escape(str(node.get("name"))),
                    escape(str(g.get("index"))),
                    escape(str(g.get("model"))) + (" (simulated)" if g.get("simulated") else ""),
                    _held(g.get("allocated_milli")),
                    _holders(m, g.get("uuid"), me),
                    _fmt(s.get("utilization_ratio"), " %", 100, 0),
                    f"{_fmt(used, '', 2**-30)} / {_fmt(g.get('memory_mib'), ' GiB', 1 / 1024)}",
                    _fmt(s.get("temperature_celsius"), " °C", digits=0),
                    _fmt(s.get("power_watts"), " W", digits=0),
                ]
            )
    gpus = table(
        "GPUs (held: every user's total; held by: the slices you may see)",
        [
            "node",
            "GPU",
            "model",
            "held",
            "held by",
            "GPU utilisation",
            "GPU memory used / total",
            "temperature",
            "power",
        ],
        rows,
    )
    sizes = sorted(
        {(s.get("milli"), s.get("label")) for v in m.free_sizes.values() for s in v},
        key=lambda s: s[0] or 0,
    )
    # A site of several pools (the box, a Slurm or Kubernetes cluster): say whose node.
    pool_of = {
        n.get("name"): n.get("pool") for n in m.inventory.get("nodes") or [] if n.get("pool")
    }
    pooled = len(set(pool_of.values())) > 1
    order = sorted(m.free_sizes, key=lambda n: (str(pool_of.get(n, "")), n) if pooled else n)
    free_rows = [
        [escape(node)]
        + ([escape(str(pool_of.get(node, "")))] if pooled else [])
        + [
            str({s.get("milli"): s.get("count") for s in m.free_sizes[node]}.get(milli, "—"))
            for milli, _ in sizes
        ]
        for node in order
    ]
    free = table(
        "free slice sizes per node (how many fit now)",
        ["node"] + (["pool"] if pooled else []) + [str(label) for _, label in sizes],
        free_rows,
    )
    slices = table(
        "slices" + (" (yours)" if all(s.get("user") == me for s in m.slices) else " (everyone's)"),
        ["user", "held by", "node", "GPU", "size"],
        [
            [
                escape("you" if s.get("user") == me else str(s.get("user"))),
                # The service names the holder; an older one gives only its kind and id.
                escape(str(s.get("name") or f"{s.get('owner_kind')} {s.get('owner')}")),
                escape(str(s.get("node"))),
                escape(str(s.get("gpu_index"))),
                _held(s.get("milli")),
            ]
            for s in m.slices
        ],
    )
    return gpus + free + slices


def cache_tables(m: TelemetryModel) -> str:
    """The latest cache figures per node; nothing when no cache reports (the notice says)."""
    rows = []
    for node, sample in sorted(m.latest.items()):
        c = sample.get("cache")
        if not isinstance(c, dict):
            continue
        rows.append(
            [
                escape(node),
                _fmt(c.get("hit_ratio"), " %", 100),
                str(c.get("hits")),
                str(c.get("misses")),
                _fmt(c.get("bytes_from_cache"), " GiB", 2**-30, 2),
                _fmt(c.get("bytes_from_remote"), " GiB", 2**-30, 2),
                str(c.get("prefetch_ahead")),
                str(c.get("evictions")),
                f"{_fmt(c.get('used'), '', 2**-30, 2)} / "
                f"{_fmt(c.get('capacity'), ' GiB', 2**-30, 2)}",
            ]
        )
    return (
        table(
            "dataset cache per node (latest)",
            [
                "node",
                "hit ratio",
                "hits",
                "misses",
                "from cache",
                "from remote",
                "prefetched ahead",
                "evictions",
                "used / capacity",
            ],
            rows,
        )
        if rows
        else ""
    )


def network_tables(m: TelemetryModel) -> str:
    rows = [
        [
            escape(time.strftime("%H:%M:%S", time.localtime(float(r.get("ts", 0))))),
            escape(str(r.get("user") or "—")),
            escape(str(r.get("backend") or "—")),
            escape(str(r.get("world_size"))),
            escape(", ".join(r.get("nodes") or []) or str(r.get("node") or "")),
            _fmt(r.get("size_bytes"), " MiB", 2**-20, 2),
            _fmt(r.get("algbw_bytes_per_second"), " GB/s", 1e-9, 3),
            _fmt(r.get("busbw_bytes_per_second"), " GB/s", 1e-9, 3),
        ]
        for r in reversed(m.allreduce[-5:])
    ]
    return table(
        "all-reduce probes, newest first (busbw = algbw · 2(n−1)/n)",
        ["when", "user", "backend", "ranks", "nodes", "size", "algbw", "busbw"],
        rows,
    )


#: The jobs table's columns (API field: header people read), in order.
JOB_HEADERS = {
    "id": "job",
    "name": "name",
    "user": "user",
    "state": "state",
    "step": "step",
    "total_steps": "of steps",
    "loss": "loss",
    "samples_per_second": "samples/s",
}


def jobs_tables(m: TelemetryModel) -> str:
    keys = [k for k in JOB_HEADERS if any(k in j for j in m.jobs)]
    rows = []
    for j in m.jobs:
        row = []
        for k in keys:
            v = j.get(k)
            row.append(
                _fmt(v, digits=4 if k == "loss" else 1)
                if isinstance(v, float)
                else escape("—" if v is None else str(v))
            )
        rows.append(row)
    return table("jobs", [JOB_HEADERS[k] for k in keys] or ["jobs"], rows)


#: Most user rows listed in the Usage tab's table.
USAGE_TABLE_USERS = 50


def usage_tables(m: TelemetryModel, me: str | None) -> str:
    """By user (yours, or everyone's for an admin) and by kind; nothing when there are no
    GPU-hours to list (the status line and the figure say why)."""
    u = m.usage
    if u.error or u.fetched is None or u.empty:
        return ""
    period = f"last {USAGE_DAYS} days"
    users = u.by_user[:USAGE_TABLE_USERS]
    whose = "yours" if all(r["name"] == me for r in u.by_user) else "everyone's"
    more = len(u.by_user) - len(users)
    caption = f"GPU-hours by user, {period} ({whose}" + (
        f"; the top {len(users)} of {len(u.by_user)})" if more else ")"
    )

    def rows(entries: list[dict], mark_me: bool) -> list[list[str]]:
        return [
            [
                escape(r["name"]) + (" (you)" if mark_me and r["name"] == me else ""),
                _hours(r["gpu_hours"]),
                escape("—" if r.get("allocations") is None else str(r["allocations"])),
            ]
            for r in entries
        ]

    return table(caption, ["user", "GPU-hours", "slices"], rows(users, True)) + table(
        f"GPU-hours by kind, {period}", ["kind", "GPU-hours", "slices"], rows(u.kinds(), False)
    )


# -- Alerts --------------------------------------------------------------------
#: A severity's colour: critical red, warning amber, info blue; resolved alerts are grey.
SEVERITY_COLORS = {"critical": "#b00020", "warning": "#e69500", "info": "#1565c0"}
RESOLVED_COLOR = "#888"
#: The header marker's (background, text) colours, by the worst firing severity.
_MARKER_COLORS = {
    "critical": ("#b00020", "#fff"),
    "warning": ("#ffb300", "#3b2500"),
    "info": ("#1565c0", "#fff"),
}
#: Most resolved alerts listed (the newest); the status line counts them all.
ALERTS_TABLE_RESOLVED = 50
#: Alerts named in the one-line summary before "and N more".
SUMMARY_NAMES = 3
EMPTY_ALERTS = f"No alerts in the last {ALERT_HOURS} h"


def how_long(seconds: float | None) -> str:
    """A duration in words a glance can read: ``45 s``, ``5 min``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds is None or math.isnan(seconds):
        return "—"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, minutes = divmod(s // 60, 60)
        return f"{h} h {minutes} min" if minutes else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def ago(t: float | None, now: float) -> str:
    """``5 min ago`` for unix time ``t``; ``just now`` under 10 s."""
    if t is None:
        return "—"
    if now - t < 10:
        return "just now"
    return f"{how_long(now - t)} ago"


def _utc(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "unknown"


def subject_text(a: dict, short: bool = False) -> str:
    """``job 3f2a1b9c0d1e``, ``deployment llm``; a GPU's uuid as it is (``GPU-...``).

    ``short``: a subject longer than 16 characters is cut to its first 12 and ``…``.
    """
    kind, subject = str(a.get("subject_kind") or ""), str(a.get("subject") or "")
    if short and len(subject) > 16:
        subject = subject[:12] + "…"
    if not kind or subject.lower().startswith(kind.lower()):
        return subject
    return f"{kind} {subject}"


def alerts_title(am: AlertsModel) -> str:
    """The tab's title: ``Alerts (2)`` while 2 fire, else ``Alerts``."""
    return f"Alerts ({am.firing})" if am.firing else "Alerts"


def _counts(am: AlertsModel) -> str:
    """``1 critical, 1 warning`` of the firing alerts."""
    n: dict[str, int] = {}
    for a in am.firing_alerts():
        n[str(a.get("severity"))] = n.get(str(a.get("severity")), 0) + 1
    return ", ".join(f"{v} {k}" for k, v in n.items())


def _firing_words(count: int) -> str:
    return f"{count} alert{'s' if count != 1 else ''} firing"


def alerts_marker(am: AlertsModel) -> str:
    """The header's badge while alerts fire (red: a critical one; amber: a warning), else ''."""
    worst = am.worst()
    if not am.firing or worst is None:
        return ""
    bg, fg = _MARKER_COLORS.get(worst, _MARKER_COLORS["info"])
    return (
        f'<span class="gpulab-alert-marker" data-severity="{escape(worst)}" '
        f'title="{escape(_counts(am))}; the Alerts tab lists them" '
        f'style="margin-left:10px;padding:1px 8px;border-radius:9px;background:{bg};'
        f'color:{fg};font-weight:600;font-size:12px;white-space:nowrap">'
        f"● {_firing_words(am.firing)}</span>"
    )


def alerts_line(am: AlertsModel) -> str:
    """The Alerts tab's own line (HTML): the error, the empty message, or the counts."""
    if am.error:
        return f'<span style="color:#b00020">{escape(am.error)}</span>'
    if am.fetched is None:
        return "alerts not fetched yet"
    if am.empty:
        return "<b>No alerts firing</b>"  # the tab's box says the rest
    resolved = len(am.resolved_alerts())
    firing = (
        f"<b>{_firing_words(am.firing)}</b> ({escape(_counts(am))})"
        if am.firing
        else "<b>No alerts firing</b>"
    )
    return f"{firing}; {resolved} resolved in the last {ALERT_HOURS} h"


def alerts_error(err: BaseException) -> str:
    """One short line for the Alerts tab: why there are no alerts (never a traceback)."""
    status = getattr(err, "status", None)
    if status == 404:
        return (
            "alerts are not available: this gpulab service has no alerts (404, older than alerts)"
        )
    text = " ".join(str(err).split()) or type(err).__name__
    if len(text) > 160:
        text = text[:159] + "…"
    why = f" ({status})" if status else ""
    return f"alerts are not available{why}: {text}"


def _severity_cell(a: dict, resolved: bool) -> str:
    severity = str(a.get("severity") or "—")
    color = RESOLVED_COLOR if resolved else SEVERITY_COLORS.get(severity, RESOLVED_COLOR)
    return (
        f'<span style="white-space:nowrap"><span class="gpulab-severity" '
        f'data-severity="{escape(severity)}" style="color:{color}">●</span> '
        f"{escape(severity)}</span>"
    )


def _nowrap(html: str, title: str | None = None) -> str:
    tip = f' title="{escape(title)}"' if title else ""
    return f'<span style="white-space:nowrap"{tip}>{html}</span>'


def _owner(a: dict, me: str | None) -> str:
    owner = a.get("owner")
    if owner is None:
        return _nowrap("— (shared)")
    return _nowrap(escape(str(owner)) + (" (you)" if owner == me else ""))


def _show_owner(am: AlertsModel, me: str | None) -> bool:
    """An admin's answer holds alerts of others or about shared things: name the owner."""
    return any(a.get("owner") != me for a in am.alerts)


def alert_name(a: dict) -> str:
    """``JobFailed #12``: the rule and the id ``%gpulab alerts --ack`` takes; who
    acknowledged it, once someone did."""
    return f"{a.get('name')}{alert_tag(a)}"


def alert_tag(a: dict) -> str:
    """What follows an alert's name: `` #12``, and ``(acked by bob)`` while it fires."""
    tag = f" #{a.get('id')}" if a.get("id") is not None else ""
    by = a.get("acknowledged_by")
    return f"{tag} (acked by {by})" if by and a.get("state") == "firing" else tag


def alerts_tables(am: AlertsModel, me: str | None, now: float | None = None) -> str:
    """Firing alerts (worst first), then the resolved ones greyed with how long they lasted;
    the empty state when none fired in the period; nothing before the first fetch or on an
    error (the status line says why)."""
    if am.error or am.fetched is None:
        return ""
    if am.empty:
        return (
            '<div class="gpulab-alerts-empty" style="margin:8px 0;padding:10px 14px;'
            "border:1px solid #cde5cf;background:#f3faf3;color:#2e5e31;font-size:13px;"
            f'display:inline-block"><b>{EMPTY_ALERTS}.</b> Alerts about your jobs, '
            "endpoints and servers (an admin's also about GPUs, nodes and disks) are "
            "listed here when they fire.</div>"
        )
    now = time.time() if now is None else now
    owner = _show_owner(am, me)

    def cells(a: dict, resolved: bool) -> list[str]:
        row = [
            _severity_cell(a, resolved),
            _nowrap(f"<b>{escape(str(a.get('name')))}</b>{escape(alert_tag(a))}"),
            escape(subject_text(a)),
        ]
        if owner:
            row.append(_owner(a, me))
        if resolved:
            row += [
                _nowrap(ago(a["resolved_ts"], now), _utc(a["resolved_ts"])),
                _nowrap(
                    how_long(
                        a["resolved_ts"] - a["since_ts"]
                        if a["resolved_ts"] is not None and a["since_ts"] is not None
                        else None
                    )
                ),
            ]
        else:
            row.append(_nowrap(ago(a["since_ts"], now), _utc(a["since_ts"])))
        row.append(escape(str(a.get("message") or "")))
        if resolved:
            row = [f'<span style="color:{RESOLVED_COLOR}">{c}</span>' for c in row]
        return row

    who = ["owner"] if owner else []
    firing = am.firing_alerts()
    out = (
        table(
            "firing now (worst first)",
            ["severity", "alert", "subject", *who, "since", "message"],
            [cells(a, False) for a in firing],
        )
        if firing
        else '<div style="font-size:12px;margin:4px 0"><b>No alerts firing.</b></div>'
    )
    resolved = am.resolved_alerts()
    if resolved:
        shown = resolved[:ALERTS_TABLE_RESOLVED]
        more = len(resolved) - len(shown)
        caption = f"resolved in the last {ALERT_HOURS} h (most recent first" + (
            f"; the newest {len(shown)} of {len(resolved)})" if more else ")"
        )
        out += "<br>" + table(
            caption,
            ["severity", "alert", "subject", *who, "resolved", "lasted", "message"],
            [cells(a, True) for a in shown],
        )
    return f'<div class="gpulab-alerts">{out}</div>'


def alerts_summary(am: AlertsModel) -> str:
    """One line of plain text: ``2 alerts firing: JobStalled (job 3f2a1b9c0d1e), ...``."""
    if am.error:
        return am.error
    if am.fetched is None:
        return "alerts not fetched yet"
    firing = am.firing_alerts()
    if not am.firing or not firing:
        resolved = len(am.resolved_alerts())
        if not resolved:
            return EMPTY_ALERTS
        return f"No alerts firing ({resolved} resolved in the last {ALERT_HOURS} h)"
    names = [f"{a.get('name')} ({subject_text(a, short=True)})" for a in firing[:SUMMARY_NAMES]]
    if len(firing) > SUMMARY_NAMES:
        names.append(f"and {len(firing) - SUMMARY_NAMES} more")
    return f"{_firing_words(am.firing)}: " + ", ".join(names)


def alerts_text(am: AlertsModel, me: str | None, now: float | None = None) -> str:
    """The alerts as a plain-text table (firing first, then resolved), for ``%gpulab alerts``."""
    now = time.time() if now is None else now
    owner = _show_owner(am, me)
    rows = []
    for a in am.firing_alerts() + am.resolved_alerts():
        resolved = a.get("state") == "resolved"
        lasted = (
            how_long(a["resolved_ts"] - a["since_ts"])
            if resolved and a["resolved_ts"] is not None and a["since_ts"] is not None
            else ""
        )
        when = (
            f"resolved {ago(a['resolved_ts'], now)}, lasted {lasted}"
            if resolved
            else f"since {ago(a['since_ts'], now)}"
        )
        state = "acked" if a.get("acknowledged_at") and not resolved else str(a.get("state"))
        row = [str(a.get("severity")), state, alert_name(a), subject_text(a)]
        if owner:
            row.append("(shared)" if a.get("owner") is None else str(a.get("owner")))
        rows.append([*row, when, str(a.get("message") or "")])
    who = ["owner"] if owner else []
    head = ["severity", "state", "alert", "subject", *who, "when", "message"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]

    out = [line(head), "-" * len(line(head)), *[line(r) for r in rows]]
    return "\n".join(x.rstrip() for x in out)
