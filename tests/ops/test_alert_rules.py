"""Each rule's in-service half on a Facts snapshot: what fires it, for whom, what not.

The rules that need a real service to be reached (JobStalled, JobFailed, the GPU
faults, NodeTelemetryStale) are also tested end to end in test_alerts_service.py;
here are the thresholds and the edges, on facts written out by hand, plus the
webhook's redaction of its URL.
"""

from __future__ import annotations

import pytest

from gpulab.service.operations.rules import Facts, Thresholds, duration, rules
from gpulab.service.operations.webhook import redact

NOW = 1_800_000_000.0
UUID = "GPU-11111111-0000-0000-0000-000000000000"


DEFAULT = Thresholds()


def evaluate(name: str, facts: Facts, th: Thresholds = DEFAULT):
    return {r.name: r for r in rules(th)}[name].evaluate(facts)


def version(**kw) -> dict:
    return {
        "deployment_id": "d1",
        "user": "alice",
        "name": "resnet",
        "version": 1,
        "state": "running",
        "message": "running",
        "restarts": 0,
        "recent_restarts": 0,
        "error_rate": 0.0,
        "requests_per_second": 5.0,
        "p99_latency_ms": 20.0,
        **kw,
    }


def test_endpoint_errors_need_enough_calls_and_fire_for_the_owner():
    th = Thresholds(alert_endpoint_error_ratio=0.05)
    assert evaluate("EndpointErrorRateHigh", Facts(NOW, versions=[version()]), th) == []
    [f] = evaluate("EndpointErrorRateHigh", Facts(NOW, versions=[version(error_rate=0.2)]), th)
    assert (f.subject_kind, f.subject, f.owner) == ("deployment", "alice/resnet", "alice")
    assert "20% of calls failed" in f.message and "--rollback resnet" in f.message
    # One failed call of two is no rate; a failed version is ReplicaCrashLooping's.
    quiet = version(error_rate=0.5, requests_per_second=0.05)
    assert evaluate("EndpointErrorRateHigh", Facts(NOW, versions=[quiet]), th) == []
    dead = version(error_rate=1.0, state="failed")
    assert evaluate("EndpointErrorRateHigh", Facts(NOW, versions=[dead]), th) == []


def test_latency_and_crash_loops():
    th = Thresholds(alert_endpoint_p99_ms=500)
    [slow] = evaluate("EndpointLatencyHigh", Facts(NOW, versions=[version(p99_latency_ms=900)]), th)
    assert "p99 latency 900 ms" in slow.message
    assert (
        evaluate("EndpointLatencyHigh", Facts(NOW, versions=[version(p99_latency_ms=None)])) == []
    )
    looping = version(recent_restarts=2, restarts=5)
    [crash] = evaluate("ReplicaCrashLooping", Facts(NOW, versions=[looping]))
    assert "restarted 2 times" in crash.message and crash.owner == "alice"
    failed = version(state="failed", message="replica exited 3 times:\n  OOM")
    [gone] = evaluate("ReplicaCrashLooping", Facts(NOW, versions=[failed]))
    assert "failed: replica exited 3 times: OOM" in gone.message and "\n" not in gone.message
    assert evaluate("ReplicaCrashLooping", Facts(NOW, versions=[version(restarts=9)])) == []


def test_restart_loop_counts_recent_restarts_only():
    job = {"id": "j1", "user": "bob", "name": "train", "started": NOW - 5000}
    job |= {"last_report": NOW, "restarts": 7}
    assert (
        evaluate("JobRestartLoop", Facts(NOW, running_jobs=[{**job, "recent_restarts": 1}])) == []
    )
    [f] = evaluate("JobRestartLoop", Facts(NOW, running_jobs=[{**job, "recent_restarts": 3}]))
    assert (f.subject, f.owner) == ("j1", "bob") and "restarted 3 times in 30 min" in f.message


def test_idle_slices_fire_once_per_holder_on_idle_gpus_only():
    gpus = [
        {"node": "n1", "index": 0, "uuid": UUID, "utilization_max": 0.0},
        {"node": "n1", "index": 1, "uuid": "GPU-busy", "utilization_max": 0.7},
        {"node": "n1", "index": 2, "uuid": "GPU-sim", "utilization_max": None},
    ]

    def alloc(owner_kind, owner, uuid, user="carol"):
        return {
            "user": user,
            "owner_kind": owner_kind,
            "owner": owner,
            "gpu_uuid": uuid,
            "gpu_index": 0,
            "node": "n1",
            "milli": 250,
        }

    allocations = [
        alloc("server", "carol/", UUID),
        alloc("job", "j9/0", UUID, "dan"),
        alloc("job", "j9/1", UUID, "dan"),
        alloc("server", "erin/", "GPU-busy", "erin"),
        alloc("server", "fay/", "GPU-sim", "fay"),
    ]
    found = evaluate("SliceIdle", Facts(NOW, gpus=gpus, allocations=allocations))
    assert sorted((f.subject_kind, f.subject, f.owner) for f in found) == [
        ("job", "j9", "dan"),
        ("server", "carol/", "carol"),
    ]
    rule = {r.name: r for r in rules(Thresholds(alert_slice_idle_seconds=7200))}["SliceIdle"]
    assert rule.for_s == 7200 and rule.prometheus()["for"] == "2h"


def test_quota_disk_and_temperature_thresholds():
    th = Thresholds(
        alert_quota_used_ratio=0.9, alert_disk_used_ratio=0.8, alert_gpu_temperature_celsius=85
    )
    quotas = [
        {"user": "alice", "used_milli": 900, "limit_milli": 1000},
        {"user": "bob", "used_milli": 500, "limit_milli": 1000},
        {"user": "zed", "used_milli": 0, "limit_milli": 0},
    ]
    [q] = evaluate("QuotaNearlyUsed", Facts(NOW, quotas=quotas), th)
    assert (q.subject_kind, q.subject, q.owner) == ("user", "alice", "alice")
    assert "holds 9/10 GPU of their 1 GPU quota (90%)" in q.message
    disks = [
        {
            "role": "data",
            "path": "/srv/gpulab",
            "total_bytes": 100 * 2**30,
            "free_bytes": 10 * 2**30,
        },
        {"role": "dataset_cache", "path": "/scratch", "total_bytes": 100, "free_bytes": 50},
    ]
    [d] = evaluate("DiskNearlyFull", Facts(NOW, disks=disks), th)
    assert (d.subject_kind, d.subject, d.owner) == ("disk", "/srv/gpulab", None)
    assert "the data disk (/srv/gpulab) is 90% full (10.0 GiB free)" in d.message
    gpus = [
        {"node": "n1", "index": 0, "uuid": UUID, "temperature_celsius": 91},
        {"node": "n1", "index": 1, "uuid": "GPU-cool", "temperature_celsius": 60},
        {"node": "n1", "index": 2, "uuid": "GPU-unknown", "temperature_celsius": None},
    ]
    [t] = evaluate("GpuTemperatureHigh", Facts(NOW, gpus=gpus), th)
    assert t.subject == UUID and t.owner is None and "91 °C" in t.message


def test_ecc_faults_and_stale_nodes():
    fault = {"node": "n1", "index": 3, "uuid": UUID, "kind": "ecc", "at": NOW - 60}
    fault["fault"] = "2 uncorrectable ECC errors"
    [f] = evaluate("GpuEccErrors", Facts(NOW, gpu_faults=[fault]))
    assert f.subject == UUID and "2 uncorrectable ECC errors" in f.message
    assert evaluate("GpuXidErrors", Facts(NOW, gpu_faults=[fault])) == []
    facts = Facts(NOW, nodes={"fresh": NOW - 5, "gone": NOW - 600})
    assert [f.subject for f in evaluate("NodeTelemetryStale", facts)] == ["gone"]


def test_stall_before_the_first_report_says_so():
    job = {"id": "j2", "user": "gus", "name": "t", "started": NOW - 700, "last_report": NOW - 700}
    job |= {"restarts": 0, "recent_restarts": 0}
    [f] = evaluate("JobStalled", Facts(NOW, running_jobs=[job]))
    assert "has sent no report() at all since" in f.message and f.owner == "gus"
    assert evaluate("JobStalled", Facts(NOW, running_jobs=[{**job, "last_report": NOW - 10}])) == []


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (90, "90s"), (300, "5m"), (3600, "1h"), (86400, "1d")]
)
def test_durations(seconds, text):
    assert duration(seconds) == text


def test_the_webhook_url_is_never_logged_whole():
    assert redact("https://user:pw@hooks.example.org:8443/T0/B1/xyz?token=s") == (
        "https://hooks.example.org:8443/…"
    )
    assert redact("http://127.0.0.1:9093") == "http://127.0.0.1:9093"


def test_thresholds_are_the_services_settings():
    """The service's Thresholds are built from its config: the rules read exactly
    what a site set (c.Thresholds.*)."""
    from traitlets.config import Config

    from gpulab.service.app import GpuLabService

    cfg = Config()
    cfg.Thresholds.alert_endpoint_p99_ms = 750.0
    cfg.Thresholds.job_stall_seconds = 90.0
    svc = GpuLabService(config=cfg)
    svc.init_settings()
    th = svc.thresholds
    assert (th.alert_endpoint_p99_ms, th.job_stall_seconds) == (750.0, 90.0)
    assert {r.name: r for r in rules(th)}["JobStalled"].expr.endswith("> 90")


def test_one_users_many_failed_jobs_are_a_few_alerts_of_short_messages(tmp_path):
    """Every round read each failed job's whole message (a rank's error, up to 1 MiB)
    and made an alert of each: one user's thousands of failures pushed everyone's
    alerts out of the webhook's queue."""
    import time

    from gpulab.db.engine import make_engine
    from gpulab.db.jobs import JobStore
    from gpulab.service.operations.facts import (
        FAILED_JOBS_PER_USER,
        FAILED_MESSAGE_CHARS,
        FactsBuilder,
    )

    engine = make_engine(f"sqlite:///{tmp_path}/jobs.sqlite")
    store = JobStore(engine)
    size = {"backend": "local", "nodes": 1, "nproc_per_node": 1, "gpu_milli": 0}
    for i in range(FAILED_JOBS_PER_USER + 5):
        store.add({"id": f"m{i}", "user": "mallory", "name": f"n{i}", **size})
        store.finish(f"m{i}", "failed", "x" * 100_000)
    store.add({"id": "a0", "user": "alice", "name": "train", **size})
    store.finish("a0", "failed", "out of memory")
    builder = FactsBuilder.__new__(FactsBuilder)
    builder.engine = engine
    failed = builder._failed_jobs(time.time())
    by_user = {u: [f for f in failed if f["user"] == u] for u in ("mallory", "alice")}
    assert len(by_user["mallory"]) == FAILED_JOBS_PER_USER
    assert all(len(f["message"]) <= FAILED_MESSAGE_CHARS for f in failed)
    assert [f["message"] for f in by_user["alice"]] == ["out of memory"]
