"""gpulab's alert rules, defined once: evaluated by the service, rendered for Prometheus.

Each :class:`Rule` has a name, a severity, a ``for`` duration, a PromQL expression
over the ``gpulab_*`` metrics (what the Helm chart's ``PrometheusRule`` carries) and
``evaluate(facts)``, the same condition judged by the service itself on a
:class:`Facts` snapshot (what :mod:`gpulab.service.operations.alerts` builds every round), so the
embedded
platform alerts without a Prometheus. Thresholds are settings of their own
(:class:`Thresholds`, ``c.Thresholds.job_stall_seconds``...).

``python -m gpulab.service.operations.rules`` prints the rules file of the chart
(``helm/gpulab/files/alerts/prometheus-rules.yaml``) with the default thresholds.

Metric labels never carry ``job`` or ``instance`` (Prometheus' own target labels):
a training job is ``job_id``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

from traitlets import Float, validate
from traitlets.config import Configurable

from gpulab.scheduler.slices import label
from gpulab.telemetry.gpu_health import gpu_faults

from ..setting_checks import positive, share, zero_or_more

SEVERITIES = ("critical", "warning", "info")
SUBJECT_KINDS = ("gpu", "node", "job", "deployment", "server", "user", "disk")
#: How long an XID or ECC event keeps its alert firing (PromQL: ``increase(...[1h])``).
GPU_FAULT_HOLD_S = 3600
#: How long a failed job's alert fires unless a later run of it succeeds.
JOB_FAILED_WINDOW_S = 3600
#: Rules about something that happened (a job failed), not a condition that holds:
#: acknowledging one of their alerts resolves it (it was seen; nothing is left to fix
#: on the platform's side), and it does not fire again for the same subject.
RESOLVED_BY_ACKNOWLEDGING = frozenset({"JobFailed"})
#: A running job's restarts counted over this window (JobRestartLoop).
RESTART_WINDOW_S = 1800
#: Restarts within the window that make a loop.
RESTART_LOOP_COUNT = 3
#: Replica restarts within the window that make a crash loop.
REPLICA_RESTART_COUNT = 2
#: Below this many calls per second an endpoint's error ratio means little.
ENDPOINT_MIN_RPS = 0.2
#: A GPU below this utilisation (0-1) is idle.
IDLE_UTILIZATION = 0.01


class Thresholds(Configurable):
    """What the alert rules compare with: ``c.Thresholds.*`` in the service's config
    (``c.GpuLabService.<name>`` still works, with a warning). Built by the service with
    ``parent=``; ``Thresholds(job_stall_seconds=1800)`` renders a site's own rules."""

    job_stall_seconds = Float(
        600.0,
        help="""Seconds a running job may go without a report() from its rank 0 (or,
        before its first, since it started) before the JobStalled alert fires for its
        owner (GET /api/v1/alerts). DESIGN.md's name, c.GpuLabService.job_stall_seconds,
        stays supported.

        c.Thresholds.job_stall_seconds = 1800
        """,
    ).tag(config=True)

    alert_gpu_temperature_celsius = Float(
        85.0,
        help="""GpuTemperatureHigh fires when a GPU stays at or above this many °C for 5 min.

        c.Thresholds.alert_gpu_temperature_celsius = 80
        """,
    ).tag(config=True)

    alert_endpoint_error_ratio = Float(
        0.05,
        help="""EndpointErrorRateHigh fires when more than this share (0-1) of an endpoint
        version's calls fail (5xx, or no replica answered) over a minute, for 2 min.

        c.Thresholds.alert_endpoint_error_ratio = 0.01
        """,
    ).tag(config=True)

    alert_endpoint_p99_ms = Float(
        2000.0,
        help="""EndpointLatencyHigh fires when an endpoint version's p99 latency over a
        minute stays above this many milliseconds for 5 min.

        c.Thresholds.alert_endpoint_p99_ms = 500
        """,
    ).tag(config=True)

    alert_slice_idle_seconds = Float(
        3600.0,
        help="""SliceIdle fires (for the holder) when a slice's GPU stays below 1%
        utilisation for this many seconds (real GPUs only: simulated ones report none).

        c.Thresholds.alert_slice_idle_seconds = 7200
        """,
    ).tag(config=True)

    alert_quota_used_ratio = Float(
        0.9,
        help="""QuotaNearlyUsed fires (for the user) when their allocations hold at least
        this share (0-1) of their milli-GPU quota for 5 min.

        c.Thresholds.alert_quota_used_ratio = 0.8
        """,
    ).tag(config=True)

    alert_disk_used_ratio = Float(
        0.9,
        help="""DiskNearlyFull fires when the disk of the data dir or of the dataset cache
        ($GPULAB_CACHE_DIR) is at least this share (0-1) full for 5 min.

        c.Thresholds.alert_disk_used_ratio = 0.95
        """,
    ).tag(config=True)

    gpu_idle_cull_seconds = Float(
        0.0,
        help="""Stop a server this many seconds after SliceIdle warned its owner that its
        GPU slice sits idle (alert_slice_idle_seconds below 1% utilisation), unless the
        GPU got busy meanwhile. 0: never (the warning only). Needs real GPUs.

        c.Thresholds.gpu_idle_cull_seconds = 1800
        """,
    ).tag(config=True)

    #: A node whose latest sample is older than this is stale (not a setting).
    node_stale_seconds = Float(120.0)

    @validate("job_stall_seconds", "alert_slice_idle_seconds", "alert_endpoint_p99_ms")
    def _positive(self, proposal):
        return positive(proposal)

    @validate("alert_endpoint_error_ratio", "alert_quota_used_ratio", "alert_disk_used_ratio")
    def _ratio(self, proposal):
        return share(proposal)

    @validate("gpu_idle_cull_seconds")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "off")


DEFAULTS = Thresholds()


@dataclass(frozen=True)
class Finding:
    """One thing a rule found now. ``subject`` names it within its kind (a GPU's
    UUID, a job's id, ``user/name`` of a deployment); ``owner`` is the user it is
    about (None: a shared thing, for admins)."""

    subject_kind: str
    subject: str
    owner: str | None
    message: str
    labels: dict = field(default_factory=dict)


@dataclass
class Facts:
    """What the rules judge, taken once per round (see
    :class:`gpulab.service.operations.alerts.FactsBuilder`).

    Times are unix seconds. Each list item is a plain dict:

    * ``nodes``: node -> time of its latest sample (nodes seen since the start).
    * ``gpus``: ``{node, index, uuid, name, temperature_celsius, utilization_max}``
      from each node's latest sample (``utilization_max``: the highest since the
      previous round).
    * ``gpu_faults``: ``{node, index, uuid, kind, fault, at}``, from
      :func:`gpulab.telemetry.gpu_health.gpu_faults` over consecutive samples:
      ``kind`` ``xid``/``ecc`` events of the last :data:`GPU_FAULT_HOLD_S`, and
      ``lost`` as the latest sample says.
    * ``running_jobs``: ``{id, user, name, started, last_report, restarts,
      recent_restarts}``; ``last_report``: rank 0's newest ``report()``, else the start.
    * ``failed_jobs``: ``{id, user, name, finished, message}``, failed within
      :data:`JOB_FAILED_WINDOW_S` with no later run of the same name submitted.
    * ``versions``: one per deployment version: ``{deployment_id, user, name,
      version, state, message, restarts, recent_restarts, error_rate,
      requests_per_second, p99_latency_ms}``.
    * ``allocations``: the ledger's rows.
    * ``quotas``: ``{user, used_milli, limit_milli}`` of users holding slices under a limit.
    * ``disks``: ``{role, path, total_bytes, free_bytes}``.
    """

    now: float
    nodes: dict[str, float] = field(default_factory=dict)
    gpus: list[dict] = field(default_factory=list)
    gpu_faults: list[dict] = field(default_factory=list)
    running_jobs: list[dict] = field(default_factory=list)
    failed_jobs: list[dict] = field(default_factory=list)
    versions: list[dict] = field(default_factory=list)
    allocations: list[dict] = field(default_factory=list)
    quotas: list[dict] = field(default_factory=list)
    disks: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str
    for_s: float
    expr: str  # PromQL over gpulab_* metrics
    summary: str
    description: str
    evaluate: Callable[[Facts], list[Finding]]

    def prometheus(self) -> dict:
        """This rule as a Prometheus alerting rule."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": duration(self.for_s),
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def duration(seconds: float) -> str:
    """Prometheus' duration (``1h``, ``5m``, ``90s``, ``0s``)."""
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def fault_kind(fault: str) -> str:
    """``xid``, ``ecc`` or ``lost``: which rule one of :func:`gpu_faults`'s lines is for."""
    if fault.startswith("GPU lost"):
        return "lost"
    if fault.startswith("XID"):
        return "xid"
    return "ecc"


def sample_faults(gpu: dict, previous: dict | None) -> list[tuple[str, str]]:
    """``(kind, fault)`` for one GPU of a sample (the service's one judge of GPU health)."""
    return [(fault_kind(f), f) for f in gpu_faults(gpu, previous)]


def _clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _gpu_labels(g: dict) -> dict:
    return {"hostname": g["node"], "gpu": str(g.get("index", "")), "UUID": g["uuid"]}


# -- the rules' in-service halves ----------------------------------------------------------
def _faults(kind: str, fix: str) -> Callable[[Facts], list[Finding]]:
    def evaluate(facts: Facts) -> list[Finding]:
        out: dict[str, Finding] = {}
        for f in sorted(facts.gpu_faults, key=lambda f: f["at"]):
            if f["kind"] != kind:
                continue
            out[f["uuid"]] = Finding(
                "gpu",
                f["uuid"],
                None,
                f"GPU {f['index']} ({f['uuid']}) on {f['node']}: {f['fault']} at "
                f"{_clock(f['at'])}; {fix}",
                _gpu_labels(f),
            )
        return list(out.values())

    return evaluate


def _temperature(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        out = []
        for g in facts.gpus:
            t = g.get("temperature_celsius")
            if isinstance(t, (int, float)) and t >= th.alert_gpu_temperature_celsius:
                out.append(
                    Finding(
                        "gpu",
                        g["uuid"],
                        None,
                        f"GPU {g['index']} ({g['uuid']}) on {g['node']} runs at {t:g} °C, at or "
                        f"above {th.alert_gpu_temperature_celsius:g} °C; check the node's "
                        f"cooling and airflow before it throttles",
                        _gpu_labels(g),
                    )
                )
        return out

    return evaluate


def _stale_nodes(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        return [
            Finding(
                "node",
                node,
                None,
                f"node {node} sent no telemetry since {_clock(ts)} (over "
                f"{_minutes(th.node_stale_seconds)}); check its gpulab agent "
                f"(or the service's local sampler) is running and can reach the service",
                {"hostname": node},
            )
            for node, ts in sorted(facts.nodes.items())
            if facts.now - ts > th.node_stale_seconds
        ]

    return evaluate


def _job_labels(job: dict) -> dict:
    return {"job_id": job["id"], "job_name": job["name"], "user": job["user"]}


def _stalled(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        out = []
        for job in facts.running_jobs:
            if facts.now - job["last_report"] < th.job_stall_seconds:
                continue
            what = "report()" if job["last_report"] > job["started"] else "report() at all"
            out.append(
                Finding(
                    "job",
                    job["id"],
                    job["user"],
                    f"job {job['name']} ({job['id']}) has sent no {what} since "
                    f"{_clock(job['last_report'])} (over {_minutes(th.job_stall_seconds)}); "
                    f"read its logs for a hang or a stuck rank, and cancel it if it is stuck",
                    _job_labels(job),
                )
            )
        return out

    return evaluate


def _failed(facts: Facts) -> list[Finding]:
    return [
        Finding(
            "job",
            job["id"],
            job["user"],
            f"job {job['name']} ({job['id']}) failed at {_clock(job['finished'])}: "
            f"{' '.join(str(job['message']).split())[:300]}; read its logs, fix the cell "
            f"and submit it again",
            _job_labels(job),
        )
        for job in facts.failed_jobs
    ]


def _restart_loop(facts: Facts) -> list[Finding]:
    return [
        Finding(
            "job",
            job["id"],
            job["user"],
            f"job {job['name']} ({job['id']}) restarted {job['recent_restarts']} times in "
            f"{_minutes(RESTART_WINDOW_S)} ({job['restarts']} in all); a rank keeps failing: "
            f"read its logs and cancel the job until the cause is fixed",
            _job_labels(job),
        )
        for job in facts.running_jobs
        if job.get("recent_restarts", 0) >= RESTART_LOOP_COUNT
    ]


def _version_labels(v: dict) -> dict:
    return {
        "deployment": v["deployment_id"],
        "version": str(v["version"]),
        "deployment_name": v["name"],
        "user": v["user"],
    }


def _live(v: dict) -> bool:
    return v["state"] not in ("failed", "idle")


def _error_rate(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        return [
            Finding(
                "deployment",
                f"{v['user']}/{v['name']}",
                v["user"],
                f"endpoint {v['name']} version {v['version']}: {v['error_rate']:.0%} of calls "
                f"failed in the last minute (limit {th.alert_endpoint_error_ratio:.0%}); read "
                f"its replicas' logs, or roll back (%deploy --rollback {v['name']})",
                _version_labels(v),
            )
            for v in facts.versions
            if _live(v)
            and (v.get("requests_per_second") or 0) >= ENDPOINT_MIN_RPS
            and (v.get("error_rate") or 0) > th.alert_endpoint_error_ratio
        ]

    return evaluate


def _latency(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        return [
            Finding(
                "deployment",
                f"{v['user']}/{v['name']}",
                v["user"],
                f"endpoint {v['name']} version {v['version']}: p99 latency "
                f"{v['p99_latency_ms']:.0f} ms over the last minute (limit "
                f"{th.alert_endpoint_p99_ms:g} ms); add replicas (%deploy --replicas MIN:MAX) "
                f"or lower --max-latency-ms / the batch size",
                _version_labels(v),
            )
            for v in facts.versions
            if _live(v)
            and v.get("p99_latency_ms") is not None
            and v["p99_latency_ms"] > th.alert_endpoint_p99_ms
        ]

    return evaluate


def _crash_loop(facts: Facts) -> list[Finding]:
    out = []
    for v in facts.versions:
        if v["state"] == "failed":
            why = f"failed: {' '.join(str(v['message']).split())[:200]}"
        elif v.get("recent_restarts", 0) >= REPLICA_RESTART_COUNT:
            why = f"replicas restarted {v['recent_restarts']} times in {_minutes(RESTART_WINDOW_S)}"
        else:
            continue
        out.append(
            Finding(
                "deployment",
                f"{v['user']}/{v['name']}",
                v["user"],
                f"endpoint {v['name']} version {v['version']} {why}; read its logs "
                f"(%deploy --logs {v['name']}), then deploy a fixed model or stop it",
                _version_labels(v),
            )
        )
    return out


def _idle(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        util = {g["uuid"]: g.get("utilization_max") for g in facts.gpus}
        seen: dict[tuple[str, str], Finding] = {}
        for a in facts.allocations:
            u = util.get(a["gpu_uuid"])
            if not isinstance(u, (int, float)) or u >= IDLE_UTILIZATION:
                continue
            kind = a["owner_kind"] if a["owner_kind"] in SUBJECT_KINDS else "server"
            owner = a["owner"]
            if kind == "job":
                owner = owner.split("/", 1)[0]  # "<job id>/<rank>": one alert per job
            fix = "stop it to give the GPU back"
            if kind == "server" and th.gpu_idle_cull_seconds > 0:
                fix = (
                    f"gpulab stops it {_minutes(th.gpu_idle_cull_seconds)} after this "
                    f"warning unless the GPU gets busy; {fix}"
                )
            seen[(kind, owner)] = Finding(
                kind,
                owner,
                a["user"],
                f"{a['user']}'s {kind} {owner} holds {label(a['milli'])} of GPU "
                f"{a['gpu_index']} on {a['node']}, idle for over "
                f"{_minutes(th.alert_slice_idle_seconds)}; {fix}",
                {"hostname": a["node"], "UUID": a["gpu_uuid"], "user": a["user"]},
            )
        return list(seen.values())

    return evaluate


def _quota(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        return [
            Finding(
                "user",
                q["user"],
                q["user"],
                f"{q['user']} holds {label(q['used_milli'])} of their {label(q['limit_milli'])} "
                f"quota ({q['used_milli'] / q['limit_milli']:.0%}); stop idle servers, jobs "
                f"or endpoints, or ask an admin for more",
                {"user": q["user"]},
            )
            for q in facts.quotas
            if q["limit_milli"] and q["used_milli"] / q["limit_milli"] >= th.alert_quota_used_ratio
        ]

    return evaluate


def _disk(th: Thresholds):
    def evaluate(facts: Facts) -> list[Finding]:
        out = []
        for d in facts.disks:
            if not d["total_bytes"]:
                continue
            used = 1 - d["free_bytes"] / d["total_bytes"]
            if used >= th.alert_disk_used_ratio:
                out.append(
                    Finding(
                        "disk",
                        d["path"],
                        None,
                        f"the {d['role'].replace('_', ' ')} disk ({d['path']}) is {used:.0%} "
                        f"full ({d['free_bytes'] / 2**30:.1f} GiB free); free space or grow "
                        f"the volume before writes fail",
                        {"path": d["path"], "role": d["role"]},
                    )
                )
        return out

    return evaluate


# -- the rules -------------------------------------------------------------------------
def rules(th: Thresholds = DEFAULTS) -> list[Rule]:
    """Every rule, with these thresholds (names as in the alerts contract)."""
    stall = int(th.job_stall_seconds)
    err = th.alert_endpoint_error_ratio
    calls = "sum by (deployment, version) (rate(gpulab_endpoint_requests_total[5m]))"
    errors = (
        'sum by (deployment, version) (rate(gpulab_endpoint_requests_total{outcome="error"}[5m]))'
    )
    restart_window = duration(RESTART_WINDOW_S)
    return [
        Rule(
            "GpuXidErrors",
            "critical",
            0,
            f"increase(gpulab_gpu_xid_errors_total[{duration(GPU_FAULT_HOLD_S)}]) > 0",
            "GPU {{ $labels.gpu }} on {{ $labels.hostname }} reported a critical XID error",
            "An XID that means the GPU itself is at fault (its code: gpulab_gpu_last_xid). "
            "Drain the GPU and have it checked; a reset or reboot may clear it.",
            _faults("xid", "drain the GPU and have it checked (a reset or reboot may clear it)"),
        ),
        Rule(
            "GpuEccErrors",
            "critical",
            0,
            f"increase(gpulab_gpu_ecc_uncorrected_errors_total[{duration(GPU_FAULT_HOLD_S)}]) > 0",
            "GPU {{ $labels.gpu }} on {{ $labels.hostname }} had uncorrectable ECC errors",
            "Uncorrectable (double-bit) ECC errors corrupt what runs on the GPU. Drain it "
            "and reset it; replace it if they come back.",
            _faults("ecc", "drain the GPU and reset it; replace it if they come back"),
        ),
        Rule(
            "GpuTemperatureHigh",
            "warning",
            300,
            f"gpulab_gpu_temperature_celsius >= {th.alert_gpu_temperature_celsius:g}",
            "GPU {{ $labels.gpu }} on {{ $labels.hostname }} runs hot ({{ $value }} °C)",
            f"At or above {th.alert_gpu_temperature_celsius:g} °C for 5 minutes "
            "(c.Thresholds.alert_gpu_temperature_celsius). Check the node's cooling "
            "before the GPU throttles.",
            _temperature(th),
        ),
        Rule(
            "GpuLost",
            "critical",
            0,
            "gpulab_gpu_lost == 1",
            "GPU {{ $labels.gpu }} on {{ $labels.hostname }} fell off the bus",
            "NVML answers GpuIsLost: the GPU is gone until the node is rebooted or the GPU "
            "reseated. Its work has failed; drain the node.",
            _faults("lost", "drain the node and reboot it or reseat the GPU"),
        ),
        Rule(
            "NodeTelemetryStale",
            "warning",
            0,
            f"time() - gpulab_telemetry_sample_timestamp_seconds > {int(th.node_stale_seconds)}",
            "Node {{ $labels.hostname }} sends no telemetry",
            f"Its latest sample is over {_minutes(th.node_stale_seconds)} old. Check the "
            "gpulab agent on the node (or the service's local sampler).",
            _stale_nodes(th),
        ),
        Rule(
            "JobStalled",
            "warning",
            0,
            f"time() - gpulab_job_last_report_timestamp_seconds > {stall}",
            "Job {{ $labels.job_id }} sends no report()",
            f"A running job whose rank 0 called report() last over {_minutes(stall)} ago "
            "(c.Thresholds.job_stall_seconds). Read its logs for a hang; cancel it if stuck.",
            _stalled(th),
        ),
        Rule(
            "JobFailed",
            "warning",
            0,
            f"time() - gpulab_job_failed_timestamp_seconds < {JOB_FAILED_WINDOW_S}",
            "Job {{ $labels.job_id }} failed",
            "A job failed in the last hour and its user has not submitted it (the same "
            "name) again nor acknowledged the alert. Read its logs, fix it, submit it again.",
            _failed,
        ),
        Rule(
            "JobRestartLoop",
            "warning",
            0,
            f"increase(gpulab_job_restarts_total[{restart_window}]) >= {RESTART_LOOP_COUNT}",
            "Job {{ $labels.job_id }} keeps restarting",
            f"{RESTART_LOOP_COUNT} or more restarts within {_minutes(RESTART_WINDOW_S)}: a "
            "rank fails again after each restart. Read its logs; cancel it until fixed.",
            _restart_loop,
        ),
        Rule(
            "EndpointErrorRateHigh",
            "warning",
            120,
            f"({errors} / {calls} > {err:g}) and {calls} >= {ENDPOINT_MIN_RPS:g}",
            "Endpoint {{ $labels.deployment }} v{{ $labels.version }} fails calls",
            f"More than {err:.0%} of calls fail (5xx or no replica) "
            "(c.Thresholds.alert_endpoint_error_ratio). Read the replicas' logs or roll back.",
            _error_rate(th),
        ),
        Rule(
            "EndpointLatencyHigh",
            "warning",
            300,
            f"gpulab_endpoint_latency_p99_seconds > {th.alert_endpoint_p99_ms / 1000:g}",
            "Endpoint {{ $labels.deployment }} v{{ $labels.version }} is slow",
            f"p99 latency over {th.alert_endpoint_p99_ms:g} ms for 5 minutes "
            "(c.Thresholds.alert_endpoint_p99_ms). Add replicas or lower the batch delay.",
            _latency(th),
        ),
        Rule(
            "ReplicaCrashLooping",
            "critical",
            0,
            f"increase(gpulab_endpoint_replica_restarts_total[{restart_window}]) "
            f">= {REPLICA_RESTART_COUNT} or gpulab_endpoint_failed == 1",
            "Endpoint {{ $labels.deployment }} v{{ $labels.version }} crash-loops",
            "Its replicas keep restarting, or the version failed. Read its logs; deploy a "
            "fixed model or stop it.",
            _crash_loop,
        ),
        Rule(
            "SliceIdle",
            "info",
            th.alert_slice_idle_seconds,
            f"max_over_time(gpulab_gpu_utilization_ratio[5m]) < {IDLE_UTILIZATION:g} "
            "and on (UUID) gpulab_gpu_allocated_ratio > 0",
            "GPU {{ $labels.gpu }} on {{ $labels.hostname }} is held but idle",
            f"Allocated but below {IDLE_UTILIZATION:.0%} utilisation for "
            f"{_minutes(th.alert_slice_idle_seconds)} (c.Thresholds.alert_slice_idle_seconds)."
            " Ask its holder to stop it.",
            _idle(th),
        ),
        Rule(
            "QuotaNearlyUsed",
            "info",
            300,
            "gpulab_quota_users_near_limit > 0",
            "Users holding nearly all of their GPU quota: {{ $value }}",
            f"At or above {th.alert_quota_used_ratio:.0%} of their GPU quota "
            "(c.Thresholds.alert_quota_used_ratio). The metric counts them; who they "
            "are is in GET /api/v1/alerts (admins). Stop idle work or raise the quota.",
            _quota(th),
        ),
        Rule(
            "DiskNearlyFull",
            "warning",
            300,
            f"1 - gpulab_disk_free_ratio >= {th.alert_disk_used_ratio:g}",
            "The {{ $labels.role }} disk ({{ $labels.path }}) is nearly full",
            f"At or above {th.alert_disk_used_ratio:.0%} used "
            "(c.Thresholds.alert_disk_used_ratio). Free space or grow the volume.",
            _disk(th),
        ),
    ]


RULE_NAMES = tuple(r.name for r in rules())


def prometheus_rules(th: Thresholds = DEFAULTS) -> dict:
    """The rules file: ``{"groups": [{"name": "gpulab", "rules": [...]}]}``."""
    return {"groups": [{"name": "gpulab", "rules": [r.prometheus() for r in rules(th)]}]}


HEADER = (
    "# gpulab's alert rules for Prometheus (the Helm chart's PrometheusRule).\n"
    "# Generated by `python -m gpulab.service.operations.rules`; do not edit: the rules\n"
    "# are defined in service/operations/rules.py, and the service evaluates the same ones.\n"
)


def render_yaml(th: Thresholds = DEFAULTS) -> str:
    import yaml

    return HEADER + yaml.safe_dump(
        prometheus_rules(th), sort_keys=False, allow_unicode=True, width=100
    )


if __name__ == "__main__":
    print(render_yaml(), end="")
