"""The Prometheus metrics the chart's alert rules read, beside those of
:mod:`gpulab.service.telemetry.metrics`.

They come from the alert engine's latest :class:`~gpulab.service.operations.rules.Facts` snapshot,
so Prometheus and the service judge the same numbers (at most one
``alert_interval_seconds`` old). Jobs and endpoints are labelled by id
(``job_id``; ``deployment``, ``version`` as in ``gpulab_endpoint_*``), never by
``job`` (Prometheus' own target label), and never by user: a user reads the
series of their own jobs and endpoints only (:mod:`gpulab.service.telemetry.metrics`), and who
holds what
is for admins (``GET /api/v1/alerts`` names the users near their quota; here they
are only counted).

The GPU health series (``gpulab_gpu_xid_errors_total``, ``gpulab_gpu_lost``...)
are the exporter's (:mod:`gpulab.telemetry.exporter`).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class OpsCollector:
    def __init__(self, alerts):
        self.alerts = alerts  # the AlertEngine

    def describe(self) -> list:
        return []  # the series depend on the snapshot

    def collect(self):
        facts = self.alerts.last_facts
        job = ["job_id"]
        report = GaugeMetricFamily(
            "gpulab_job_last_report_timestamp_seconds",
            "When a running job's rank 0 last called report() (its start before the first), "
            "unix time.",
            labels=job,
        )
        restarts = CounterMetricFamily(
            "gpulab_job_restarts", "Restarts of a running job's ranks.", labels=job
        )
        failed = GaugeMetricFamily(
            "gpulab_job_failed_timestamp_seconds",
            "When a job failed (unix time): jobs failed in the last hour whose name has not "
            "run successfully since.",
            labels=job,
        )
        ver = ["deployment", "version"]
        p99 = GaugeMetricFamily(
            "gpulab_endpoint_latency_p99_seconds",
            "p99 latency of an endpoint version's calls over the last minute.",
            labels=ver,
        )
        replica_restarts = CounterMetricFamily(
            "gpulab_endpoint_replica_restarts",
            "Restarts of an endpoint version's replicas.",
            labels=ver,
        )
        ver_failed = GaugeMetricFamily(
            "gpulab_endpoint_failed",
            "1 when an endpoint version failed (its replicas kept crashing), else 0.",
            labels=ver,
        )
        quota = GaugeMetricFamily(
            "gpulab_quota_users_near_limit",
            "Users whose allocations hold at least c.Thresholds.alert_quota_used_ratio "
            "of their milli-GPU quota.",
        )
        disk = GaugeMetricFamily(
            "gpulab_disk_free_ratio",
            "Free share of the disk under a directory the service writes (0-1).",
            labels=["role", "path"],
        )
        disk_free = GaugeMetricFamily(
            "gpulab_disk_free_bytes",
            "Free bytes of the disk under a directory the service writes.",
            labels=["role", "path"],
        )
        if facts is not None:
            for j in facts.running_jobs:
                report.add_metric([j["id"]], j["last_report"])
                restarts.add_metric([j["id"]], j["restarts"])
            for j in facts.failed_jobs:
                failed.add_metric([j["id"]], j["finished"])
            for v in facts.versions:
                key = [v["deployment_id"], str(v["version"])]
                if v.get("p99_latency_ms") is not None:
                    p99.add_metric(key, v["p99_latency_ms"] / 1000)
                replica_restarts.add_metric(key, v["restarts"])
                ver_failed.add_metric(key, 1 if v["state"] == "failed" else 0)
            ratio = self.alerts.thresholds.alert_quota_used_ratio
            near = [q for q in facts.quotas if q["limit_milli"]]
            quota.add_metric([], sum(q["used_milli"] / q["limit_milli"] >= ratio for q in near))
            for d in facts.disks:
                if d["total_bytes"]:
                    disk.add_metric([d["role"], d["path"]], d["free_bytes"] / d["total_bytes"])
                    disk_free.add_metric([d["role"], d["path"]], d["free_bytes"])
        yield from (report, restarts, failed, p99, replica_restarts, ver_failed, quota)
        yield from (disk, disk_free)
