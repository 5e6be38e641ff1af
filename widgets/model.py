"""What the dashboard knows: telemetry answers turned into bounded numpy history.

``TelemetryModel.ingest(answer)`` takes one ``GET /telemetry`` answer (the
shape ``gpulab.client`` returns). The first answer (``since`` unset) carries
the service's recent history, so a new dashboard, or one after a page reload,
starts with the last minutes already drawn. Everything is kept as served: a
user's answer holds their own slices and totals, an admin's everyone's with
names; the model never widens or narrows that.

A value a source did not report stays NaN (a gap in a plot), and a source a
node lacks is listed in ``missing`` with the reason: the dashboard says "no
GPU driver" rather than drawing zeros.

GPU-hours (``GET /usage``) change slowly and are fetched apart from the
telemetry, every half minute or so: ``TelemetryModel.usage`` (a ``UsageModel``)
holds the latest answers by user and by kind, or why there are none.

Alerts (``GET /alerts``, the last 24 h, firing and resolved) are fetched on the
same thread every few seconds: ``TelemetryModel.alerts`` (an ``AlertsModel``).
"""

from __future__ import annotations

import math
from datetime import datetime

from .history import Ring, number

GPU_COLUMNS = (
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
)
RATE_COLUMNS = ("rx_bytes_per_second", "tx_bytes_per_second")
CACHE_COLUMNS = (
    "hit_ratio",
    "bytes_from_cache",
    "bytes_from_remote",
    "prefetch_ahead",
    "evictions",
    "used",
    "capacity",
)
JOB_COLUMNS = ("step", "loss", "samples_per_second")
SOURCES = ("gpu", "nic", "rdma", "cache")
#: The kinds of holder GPU time is accounted to (``GET /usage?group_by=kind``).
USAGE_KINDS = ("server", "job", "deployment")
#: The Usage tab's period: the last this many days.
USAGE_DAYS = 7

#: The Alerts tab's period: alerts that fired or resolved in the last this many hours.
ALERT_HOURS = 24
#: Severities, worst first (the service's words), and their colours in the dashboard.
ALERT_SEVERITIES = ("critical", "warning", "info")

#: A node whose newest sample is older than this (against the newest of any node)
#: no longer holds back the ``since`` cursor: a dead agent must not make every
#: later answer carry minutes of the other nodes' samples again.
STALE_NODE_S = 30.0


def _shown_nics(nics: list[dict]) -> list[dict]:
    """Physical NICs; a node with none (a VM, a network namespace) shows its up virtual ones."""
    physical = [n for n in nics if not n.get("virtual")]
    if physical:
        return physical
    return [n for n in nics if n.get("device") != "lo" and n.get("operstate") == "up"]


class UsageModel:
    """The latest ``GET /usage`` answers (by user, by kind), or the one line saying why not.

    Rows are kept as served: a user's answer holds their own row, an admin's
    everyone's. ``fetched`` is the unix time of the last successful fetch;
    ``error`` the last failure (cleared by the next success, which also keeps
    the rows of an earlier success from being shown as current after a failure).
    """

    def __init__(self):
        self.by_user: list[dict] = []
        self.by_kind: list[dict] = []
        self.since: str | None = None
        self.until: str | None = None
        self.fetched: float | None = None
        self.error: str | None = None

    def ingest(self, by_user: dict, by_kind: dict, when: float) -> None:
        """Take the two answers of one fetch (``when``: unix seconds it was made)."""
        self.by_user = _usage_rows(by_user, "user")
        self.by_kind = _usage_rows(by_kind, "kind")
        self.since = by_user.get("since")
        self.until = by_user.get("until")
        self.fetched = when
        self.error = None

    def fail(self, error: str) -> None:
        self.by_user, self.by_kind = [], []
        self.error = error

    @property
    def total_hours(self) -> float:
        """Every row's GPU-hours (the larger sum, should the two groupings disagree)."""
        return max(
            sum(r["gpu_hours"] for r in self.by_user), sum(r["gpu_hours"] for r in self.by_kind)
        )

    @property
    def empty(self) -> bool:
        """Fetched, and no GPU time used in the period."""
        return self.fetched is not None and self.error is None and not self.total_hours > 0

    def kinds(self) -> list[dict]:
        """By kind as served (most first), then every known kind that used nothing, at 0."""
        seen = {r["name"] for r in self.by_kind}
        zero = {"gpu_hours": 0.0, "allocations": 0}
        return self.by_kind + [{"name": k, **zero} for k in USAGE_KINDS if k not in seen]


def _usage_rows(answer: dict, key: str) -> list[dict]:
    """``{"name", "gpu_hours", "allocations"}`` per served row, most GPU-hours first."""
    key = str(answer.get("group_by") or key)
    rows = []
    for row in answer.get("rows") or []:
        if not isinstance(row, dict):
            continue
        hours = number(row.get("gpu_hours"))
        if math.isnan(hours):
            hours = number(row.get("milli_gpu_seconds")) / 1000 / 3600
        rows.append(
            {
                "name": str(row.get(key)),
                "gpu_hours": 0.0 if math.isnan(hours) else hours,
                "allocations": row.get("allocations"),
            }
        )
    return sorted(rows, key=lambda r: -r["gpu_hours"])


def _unix(value) -> float | None:
    """An ISO 8601 time of the service (``...Z`` or with an offset) as unix seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo else None


class AlertsModel:
    """The latest ``GET /alerts`` answer (the last ``ALERT_HOURS``), or the one line why not.

    Alerts are kept as served (a user's: about their own things; an admin's:
    every alert), each with ``since_ts`` and ``resolved_ts`` (unix seconds or
    None) added. ``firing`` is the service's count of firing alerts; ``fetched``
    the unix time of the last successful fetch; ``error`` the last failure, which
    clears the alerts (an earlier answer is not shown as current).
    """

    def __init__(self):
        self.alerts: list[dict] = []
        self.firing: int = 0
        self.fetched: float | None = None
        self.error: str | None = None

    def ingest(self, answer: dict, when: float) -> None:
        rows = [a for a in (answer or {}).get("alerts") or [] if isinstance(a, dict)]
        self.alerts = [
            {**a, "since_ts": _unix(a.get("since")), "resolved_ts": _unix(a.get("resolved_at"))}
            for a in rows
        ]
        count = (answer or {}).get("firing")
        self.firing = (
            count
            if isinstance(count, int) and not isinstance(count, bool)
            else len(self.firing_alerts())
        )
        self.fetched = when
        self.error = None

    def fail(self, error: str) -> None:
        self.alerts, self.firing = [], 0
        self.error = error

    @property
    def empty(self) -> bool:
        """Fetched, and no alert fired or resolved in the period."""
        return self.fetched is not None and self.error is None and not self.alerts

    def firing_alerts(self) -> list[dict]:
        """Those that fire now: the worst severity first, then the newest."""
        rank = {s: i for i, s in enumerate(ALERT_SEVERITIES)}
        return sorted(
            (a for a in self.alerts if a.get("state") == "firing"),
            key=lambda a: (rank.get(a.get("severity"), len(rank)), -(a["since_ts"] or 0)),
        )

    def resolved_alerts(self) -> list[dict]:
        """Those that resolved, the most recently resolved first."""
        return sorted(
            (a for a in self.alerts if a.get("state") == "resolved"),
            key=lambda a: -(a["resolved_ts"] or a["since_ts"] or 0),
        )

    def worst(self) -> str | None:
        """The worst severity among the firing alerts (None: none fires)."""
        firing = self.firing_alerts()
        return str(firing[0].get("severity")) if firing else None


class TelemetryModel:
    def __init__(self, max_age_s: float = 600.0, capacity: int = 900):
        self.max_age_s = float(max_age_s)
        self.capacity = int(capacity)
        self.gpus: dict[tuple[str, str], Ring] = {}
        self.nics: dict[tuple[str, str], Ring] = {}
        self.rdma: dict[tuple[str, str], Ring] = {}
        self.cache: dict[str, Ring] = {}
        self.allocated: dict[tuple[str, str], Ring] = {}
        self.job_history: dict[str, Ring] = {}
        self.missing: dict[str, dict[str, str]] = {}
        self.latest: dict[str, dict] = {}
        self.inventory: dict = {"nodes": []}
        self.slices: list[dict] = []
        self.free_sizes: dict[str, list[dict]] = {}
        self.jobs: list[dict] = []
        self.allreduce: list[dict] = []
        self.now: float | None = None
        self.interval_s: float = 1.0
        self.answers = 0
        self.usage = UsageModel()
        self.alerts = AlertsModel()
        self._last_ts: dict[str, float] = {}

    # -- reading answers -------------------------------------------------------
    def cursor(self) -> float | None:
        """The ``since`` to ask for next: the oldest newest-sample of the live nodes."""
        if not self._last_ts:
            return None
        newest = max(self._last_ts.values())
        return min(t for t in self._last_ts.values() if t >= newest - STALE_NODE_S)

    def ingest(self, answer: dict) -> int:
        """Take one telemetry answer; return how many new node samples it carried."""
        self.answers += 1
        self.now = number(answer.get("now"))
        self.interval_s = number(answer.get("interval_s")) or 1.0
        added = 0
        for node, entry in (answer.get("nodes") or {}).items():
            self.missing[node] = dict(entry.get("missing") or {})
            last = self._last_ts.get(node, -math.inf)
            for sample in sorted(entry.get("samples") or [], key=lambda s: s.get("ts", 0)):
                ts = number(sample.get("ts"))
                if not ts > last:  # already seen (the cursor overlaps for slower nodes)
                    continue
                self._add_sample(node, ts, sample)
                last = ts
                added += 1
            if last > -math.inf:
                self._last_ts[node] = last
        self.inventory = answer.get("inventory") or {"nodes": []}
        self.slices = list(answer.get("slices") or [])
        self.free_sizes = dict(answer.get("free_sizes") or {})
        self.jobs = [j for j in answer.get("jobs") or [] if isinstance(j, dict)]
        self.allreduce = sorted(
            (r for r in answer.get("allreduce") or [] if isinstance(r, dict)),
            key=lambda r: number(r.get("ts")),
        )
        if not math.isnan(self.now):
            self._add_snapshot(self.now)
        return added

    def _ring(self, table: dict, key, width: int) -> Ring:
        ring = table.get(key)
        if ring is None:
            ring = table[key] = Ring(self.capacity, width)
        return ring

    def _add_sample(self, node: str, ts: float, sample: dict) -> None:
        self.latest[node] = sample
        for gpu in sample.get("gpus") or []:
            key = (node, f"GPU {gpu.get('index')}")
            self._ring(self.gpus, key, len(GPU_COLUMNS)).append(
                ts, [gpu.get(c) for c in GPU_COLUMNS]
            )
        for nic in _shown_nics(sample.get("nics") or []):
            self._ring(self.nics, (node, str(nic.get("device"))), 2).append(
                ts, [nic.get(c) for c in RATE_COLUMNS]
            )
        for port in sample.get("rdma") or []:
            key = (node, f"{port.get('device')}/{port.get('port')}")
            self._ring(self.rdma, key, 2).append(ts, [port.get(c) for c in RATE_COLUMNS])
        cache = sample.get("cache")
        if isinstance(cache, dict):
            self._ring(self.cache, node, len(CACHE_COLUMNS)).append(
                ts, [cache.get(c) for c in CACHE_COLUMNS]
            )

    def _add_snapshot(self, now: float) -> None:
        """Slices held and job progress are states, not samples: record them as of ``now``."""
        for node in self.inventory.get("nodes") or []:
            for gpu in node.get("gpus") or []:
                key = (node.get("name"), f"GPU {gpu.get('index')}")
                self._ring(self.allocated, key, 1).append(now, [gpu.get("allocated_milli")])
        for job in self.jobs:
            key = str(job.get("name") or job.get("id"))
            self._ring(self.job_history, key, len(JOB_COLUMNS)).append(
                now, [job.get(c) for c in JOB_COLUMNS]
            )

    # -- what the figures read -------------------------------------------------
    def window_start(self) -> float | None:
        """Oldest time shown: ``max_age_s`` before the newest answer."""
        return None if self.now is None or math.isnan(self.now) else self.now - self.max_age_s

    def series(self, table: dict) -> list[tuple]:
        """(key, t, values) per series of ``table`` within the window, in key order."""
        since = self.window_start()
        out = []
        for key in sorted(table, key=str):
            t, v = table[key].arrays(since)
            out.append((key, t, v))
        return out

    def missing_sources(self, *sources: str) -> dict[str, dict[str, str]]:
        """{source: {node: reason}} for the given sources, nodes that lack them only."""
        out: dict[str, dict[str, str]] = {}
        for node, reasons in sorted(self.missing.items()):
            for source in sources:
                if source in reasons:
                    out.setdefault(source, {})[node] = reasons[source]
        return out

    def points(self) -> int:
        """Points held across every series (what the browser test watches grow)."""
        tables = (self.gpus, self.nics, self.rdma, self.cache, self.allocated, self.job_history)
        return sum(len(r) for table in tables for r in table.values())
