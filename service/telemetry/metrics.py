"""Prometheus metrics of the service: GPU allocation state and placement outcomes.

GPU series carry DCGM's labels (``hostname``, ``gpu``, ``UUID``, ``modelName``)
so they join with dcgm-exporter's. No user names appear in labels.

Who reads what (:meth:`Metrics.render`): series of one job or endpoint (a label
in :data:`OWNER_LABELS`: its id) say what a user runs and how busy it is, so
admins and tokens with JupyterHub's ``read:metrics`` scope (Prometheus) read
every series; a user reads the cluster's series and those of their own jobs and
endpoints. Without a token (only where ``authenticate_prometheus = False``, the
Helm chart's annotation scrape): every series straight at the service's port, the
cluster's only through the hub's proxy (which any user reaches).
"""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpulab.db.usage import totals

#: Labels whose value is one user's job or endpoint id (``job``: a nettest job's
#: all-reduce result).
OWNER_LABELS = ("job_id", "deployment", "job")


class _OwnersView:
    """A registry read as one caller may: a series with an :data:`OWNER_LABELS`
    label only when ``mine`` holds its value."""

    def __init__(self, registry: CollectorRegistry, mine: frozenset[str]):
        self.registry = registry
        self.mine = mine

    def _visible(self, labels: dict) -> bool:
        return all(labels[k] in self.mine for k in OWNER_LABELS if k in labels)

    def collect(self):
        for family in self.registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if self._visible(s.labels)]
            yield kept


class LedgerCollector:
    """Reads the ledger at scrape time, so the numbers are never stale."""

    def __init__(self, ledger, gpus: list):
        self.ledger = ledger
        self.gpus = gpus

    def collect(self):
        held = self.ledger.allocated_by_gpu()
        ratio = GaugeMetricFamily(
            "gpulab_gpu_allocated_ratio",
            "Share of the GPU held by allocations (0-1).",
            labels=["hostname", "gpu", "UUID", "modelName", "simulated"],
        )
        for g in self.gpus:
            ratio.add_metric(
                [g.node, str(g.index), g.uuid, g.model, str(g.simulated).lower()],
                held.get(g.uuid, 0) / 1000,
            )
        yield ratio
        count = GaugeMetricFamily(
            "gpulab_allocations", "Allocation rows held, by owner kind.", labels=["owner_kind"]
        )
        by_kind = Counter(a["owner_kind"] for a in self.ledger.list())
        for kind in ("server", "job", "deployment"):
            count.add_metric([kind], by_kind.get(kind, 0))
        yield count
        # GPU-seconds, by kind only: users read this series too, and who used how
        # much is for admins (GET /usage answers per user, group and kind).
        used = CounterMetricFamily(
            "gpulab_gpu_seconds",
            "GPU time held by allocations, in GPU-seconds (a 1/4 GPU for 4 s is 1).",
            labels=["kind"],
        )
        by_kind_s: Counter = Counter()
        for (_user, kind), milli_seconds in totals(self.ledger.engine).items():
            by_kind_s[kind] += milli_seconds / 1000
        for kind in ("server", "job", "deployment"):
            used.add_metric([kind], by_kind_s.get(kind, 0.0))
        yield used


class EndpointCollector:
    """Calls at the endpoint router, per version of each endpoint (ids, not names):
    what the autoscaler sees, and what a HorizontalPodAutoscaler or KEDA reads."""

    def __init__(self, deployments):
        self.deployments = deployments

    def collect(self):
        labels = ["deployment", "version", "unit"]
        inflight = GaugeMetricFamily(
            "gpulab_endpoint_inflight_requests",
            "Calls in flight at the endpoint router (waiting for a cold start included).",
            labels=labels,
        )
        replicas = GaugeMetricFamily(
            "gpulab_endpoint_replicas", "Replicas a version runs now.", labels=labels
        )
        calls = CounterMetricFamily(
            "gpulab_endpoint_requests",
            "Calls answered through the endpoint router, by outcome (error: 5xx or none).",
            labels=[*labels, "outcome"],
        )
        for unit in self.deployments.units_traffic():
            key = [unit["deployment"], str(unit["version"]), unit["unit"]]
            inflight.add_metric(key, unit["inflight"])
            replicas.add_metric(key, unit["replicas"])
            calls.add_metric([*key, "ok"], unit["calls"] - unit["errors"])
            calls.add_metric([*key, "error"], unit["errors"])
        yield inflight
        yield replicas
        yield calls


class Metrics:
    """The service's Prometheus registry: its own placement series here; the parts
    that read the ledger, the endpoints, the cordons and the alerts at scrape time
    are registered as they are built (``GpuLabService.init_*``)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.placements = PromCounter(
            "gpulab_placement_requests",
            "Placement requests by result.",
            ["result"],
            registry=self.registry,
        )
        self.placement_seconds = Histogram(
            "gpulab_placement_duration_seconds",
            "Time to place and record one request.",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )

    def observe_placement(self, result: str, seconds: float) -> None:
        self.placements.labels(result).inc()
        self.placement_seconds.observe(seconds)

    def render(self, mine: frozenset[str] | None = None) -> bytes:
        """Every series (``mine`` None), or the cluster's and those of the jobs and
        endpoints whose ids ``mine`` holds."""
        if mine is None:
            return generate_latest(self.registry)
        return generate_latest(_OwnersView(self.registry, frozenset(mine)))
