"""Prometheus metrics of the service: GPU allocation state and placement outcomes.

GPU series carry DCGM's labels (``hostname``, ``gpu``, ``UUID``, ``modelName``)
so they join with dcgm-exporter's. No user names appear in labels.

Who reads what (:meth:`Metrics.render`): series of one job or endpoint (a label
in :data:`OWNER_LABELS`: its id) say what a user runs and how busy it is, so
admins and tokens with JupyterHub's ``read:metrics`` scope (Prometheus) read
every series; a user reads the cluster's series and those of their own jobs and
endpoints. Without a token (only where
``c.TelemetrySettings.authenticate_prometheus = False``): the cluster's series on the
service's port, which users reach; every series on ``metrics_port`` alone (the Helm
chart's annotation scrape, which the network keeps users off).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy import func, select

from gpulab.db import clock
from gpulab.db.jobs import jobs
from gpulab.db.usage import UsageStore
from gpulab.scheduler.slices import DEFAULT_SLICE_SIZES

#: Labels whose value is one user's job or endpoint id (``job``: a nettest job's
#: all-reduce result).
OWNER_LABELS = ("job_id", "deployment", "job")
#: The label whose value is a user's name (GPU memory by user).
USER_LABEL = "user"


class _OwnersView:
    """A registry read as one caller may: a series with an :data:`OWNER_LABELS`
    label only when ``mine`` holds its value, and one with a user's name only when it
    is ``user``'s (no one else's name, nor what they use, is shown)."""

    def __init__(self, registry: CollectorRegistry, mine: frozenset[str], user: str = ""):
        self.registry = registry
        self.mine = mine
        self.user = user

    def _visible(self, labels: dict) -> bool:
        if USER_LABEL in labels and (not self.user or labels[USER_LABEL] != self.user):
            return False
        return all(labels[k] in self.mine for k in OWNER_LABELS if k in labels)

    def collect(self):
        for family in self.registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if self._visible(s.labels)]
            yield kept


class LedgerCollector:
    """Reads the ledger at scrape time, so the numbers are never stale.

    ``sizes``: the slice sizes the site offers (``c.InventorySettings.slice_sizes``), the
    sizes ``gpulab_slices_free`` counts per node, as the spawn form does.
    """

    def __init__(self, ledger, gpus: list, sizes: Iterable[int] = DEFAULT_SLICE_SIZES):
        self.ledger = ledger
        self.gpus = gpus
        self.sizes = [m for m in sizes if m]

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
        rows = self.ledger.list()
        by_kind = Counter(a["owner_kind"] for a in rows)
        for kind in ("server", "job", "deployment"):
            count.add_metric([kind], by_kind.get(kind, 0))
        yield count
        yield from self._slices(rows)
        # GPU-seconds, by kind only: users read this series too, and who used how
        # much is for admins (GET /usage answers per user, group and kind).
        used = CounterMetricFamily(
            "gpulab_gpu_seconds",
            "GPU time held by allocations, in GPU-seconds (a 1/4 GPU for 4 s is 1).",
            labels=["kind"],
        )
        by_kind_s: Counter = Counter()
        for (_user, kind), milli_seconds in UsageStore(self.ledger.engine).totals().items():
            by_kind_s[kind] += milli_seconds / 1000
        for kind in ("server", "job", "deployment"):
            used.add_metric([kind], by_kind_s.get(kind, 0.0))
        yield used

    def _slices(self, rows: list[dict]):
        """Slices held and free by node and size: what a dashboard of the cluster shows
        (a 2-GPU allocation is two rows of 1000, as the ledger holds it)."""
        held = GaugeMetricFamily(
            "gpulab_slices_held",
            "Allocation rows held now, by node, size in milli-GPU and owner kind.",
            labels=["hostname", "milli", "owner_kind"],
        )
        shapes = Counter((a["node"], a["milli"], a["owner_kind"]) for a in rows)
        for (node, milli, kind), n in sorted(shapes.items()):
            held.add_metric([node, str(milli), kind], n)
        yield held
        free = GaugeMetricFamily(
            "gpulab_slices_free",
            "Slices of each offered size that could still be placed on the node now "
            "(quotas aside), as the spawn form counts them.",
            labels=["hostname", "milli"],
        )
        for node, sizes in sorted(self.ledger.free_sizes(self.sizes).items()):
            for size in sizes:
                free.add_metric([node, str(size["milli"])], size["count"])
        yield free


class JobQueueCollector:
    """The job queue, read from the jobs table at scrape time: how many wait, how long
    the oldest has waited, and how often jobs were preempted (by priority class)."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        labels = ["priority_class"]
        queued = GaugeMetricFamily(
            "gpulab_jobs_queued", "Jobs waiting in the queue now.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "gpulab_job_queue_oldest_wait_seconds",
            "How long the oldest queued job has waited since it was submitted.",
            labels=labels,
        )
        preempted = CounterMetricFamily(
            "gpulab_job_preemptions",
            "Times jobs were preempted and requeued (the jobs the service keeps).",
            labels=labels,
        )
        waiting = (
            select(jobs.c.priority_class, func.count(), func.min(jobs.c.submitted))
            .where(jobs.c.state == "queued")
            .group_by(jobs.c.priority_class)
        )
        by_class = select(jobs.c.priority_class, func.sum(jobs.c.preemptions)).group_by(
            jobs.c.priority_class
        )
        with self.engine.connect() as conn:
            queue = {cls: (n, first) for cls, n, first in conn.execute(waiting)}
            classes = dict(conn.execute(by_class).all())
        now = clock.now()
        # Every class jobs have used shows, 0 when none waits: an empty queue reads 0,
        # not "no data".
        for cls in sorted(set(classes) | set(queue)):
            n, first = queue.get(cls, (0, None))
            queued.add_metric([cls], n)
            if first is not None:
                first = first if first.tzinfo else first.replace(tzinfo=dt.UTC)
                oldest.add_metric([cls], max(0.0, now - first.timestamp()))
            preempted.add_metric([cls], classes.get(cls) or 0)
        yield from (queued, oldest, preempted)


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

    def render(self, mine: frozenset[str] | None = None, user: str = "") -> bytes:
        """Every series (``mine`` None), or the cluster's and those of the jobs and
        endpoints whose ids ``mine`` holds and of ``user`` ("": no user's)."""
        if mine is None:
            return generate_latest(self.registry)
        return generate_latest(_OwnersView(self.registry, frozenset(mine), user))
