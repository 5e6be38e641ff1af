"""Small HTML pieces beside the figures: status lines and tables, from a ``TelemetryModel``.

Rows are shown as served: a user's answer only holds their own slices, so the
"held by" column names only them; an admin's holds everyone's.
"""

from __future__ import annotations

import math
import time
from html import escape

from .model import USAGE_DAYS, TelemetryModel, UsageModel

#: Which telemetry sources each tab draws (for its "missing" line).
TAB_SOURCES = {
    "Cluster": ("gpu",),
    "Cache": ("cache",),
    "Network": ("nic", "rdma"),
    "Jobs": (),
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


def status_line(m: TelemetryModel, tab: str, error: str | None) -> str:
    """Which sources this tab lacks and why; the last fetch error; when it last updated."""
    parts = []
    for source, by_node in m.missing_sources(*TAB_SOURCES[tab]).items():
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
        parts.append(f"{len(m.jobs)} job(s) you may see" if m.jobs else "no jobs to show")
    updated = f"updated {when}; {m.points()} points"
    if tab == "Usage":
        parts.append(usage_line(m.usage))
        updated = f"GPU-hours updated {_clock(m.usage.fetched)}"
    lines = "<br>".join(parts) or "all sources reporting"
    return (
        f'<div class="gpulab-status" data-tab="{tab}" data-points="{m.points()}" '
        f'style="font-size:12px;line-height:1.4">{lines}'
        f'<br><span style="color:#666">{updated}</span></div>'
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
    names = []
    for s in m.slices:
        if s.get("gpu_uuid") == uuid:
            who = "you" if s.get("user") == me else str(s.get("user"))
            names.append(f"{escape(who)} {s.get('milli')}")
    return ", ".join(names)


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
                    f"{g.get('allocated_milli', 0)} / 1000",
                    _holders(m, g.get("uuid"), me),
                    _fmt(s.get("utilization_ratio"), " %", 100, 0),
                    f"{_fmt(used, '', 2**-30)} / {_fmt(g.get('memory_mib'), ' GiB', 1 / 1024)}",
                    _fmt(s.get("temperature_celsius"), " °C", digits=0),
                    _fmt(s.get("power_watts"), " W", digits=0),
                ]
            )
    gpus = table(
        "GPUs (held: every user's total; held by: the slices you may see)",
        ["node", "GPU", "model", "held milli", "held by", "util", "memory", "temp", "power"],
        rows,
    )
    sizes = sorted(
        {(s.get("milli"), s.get("label")) for v in m.free_sizes.values() for s in v},
        key=lambda s: s[0] or 0,
    )
    free_rows = [
        [escape(node)]
        + [str({s.get("milli"): s.get("count") for s in v}.get(milli, "—")) for milli, _ in sizes]
        for node, v in sorted(m.free_sizes.items())
    ]
    free = table(
        "free slice sizes per node (how many fit now)",
        ["node"] + [str(label) for _, label in sizes],
        free_rows,
    )
    slices = table(
        "slices" + (" (yours)" if all(s.get("user") == me for s in m.slices) else " (everyone's)"),
        ["user", "kind", "owner", "node", "GPU", "milli"],
        [
            [
                escape("you" if s.get("user") == me else str(s.get("user"))),
                escape(str(s.get("owner_kind"))),
                escape(str(s.get("owner"))),
                escape(str(s.get("node"))),
                escape(str(s.get("gpu_index"))),
                escape(str(s.get("milli"))),
            ]
            for s in m.slices
        ],
    )
    return gpus + free + slices


def cache_tables(m: TelemetryModel) -> str:
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
    return table(
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


def jobs_tables(m: TelemetryModel) -> str:
    preferred = ["id", "name", "user", "state", "step", "total_steps", "loss", "samples_per_second"]
    keys = [k for k in preferred if any(k in j for j in m.jobs)]
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
    return table("jobs", keys or ["jobs"], rows)


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

    return table(caption, ["user", "GPU-hours", "allocations"], rows(users, True)) + table(
        f"GPU-hours by kind, {period}", ["kind", "GPU-hours", "allocations"], rows(u.kinds(), False)
    )
