"""The alert rules as the Helm chart ships them: a PrometheusRule rendered offline
(helm-python-sdk, z2jh switched off as in tests/kube), valid against the Prometheus
Operator's CRD schema (prometheusrule_schema.py: kubernetes-validate has none for it)
with its metadata checked by kubernetes-validate, every expression parsed by a PromQL
parser (the ``promql-parser`` package, Prometheus' grammar), the names equal to the
service's, and the committed rules file equal to a fresh ``python -m
gpulab.service.operations.rules``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from kube.kube_helpers import K8S_VERSIONS, validate_strict
from prometheusrule_schema import PROMETHEUS_RULE

from gpulab.service.operations.rules import RULE_NAMES, Thresholds, prometheus_rules, rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpulab"
RULES_FILE = CHART / "files" / "alerts" / "prometheus-rules.yaml"
SPEC_NAMES = [
    "GpuXidErrors",
    "GpuEccErrors",
    "GpuTemperatureHigh",
    "GpuLost",
    "NodeTelemetryStale",
    "JobStalled",
    "JobFailed",
    "JobRestartLoop",
    "EndpointErrorRateHigh",
    "EndpointLatencyHigh",
    "ReplicaCrashLooping",
    "SliceIdle",
    "QuotaNearlyUsed",
    "DiskNearlyFull",
]
#: Metrics the expressions may read: what gpulab exports (the service, its ops
#: collector, the telemetry exporter's GPU and health series).
EXPORTED = {
    "gpulab_gpu_xid_errors_total",
    "gpulab_gpu_ecc_uncorrected_errors_total",
    "gpulab_gpu_lost",
    "gpulab_gpu_temperature_celsius",
    "gpulab_gpu_utilization_ratio",
    "gpulab_gpu_allocated_ratio",
    "gpulab_telemetry_sample_timestamp_seconds",
    "gpulab_job_last_report_timestamp_seconds",
    "gpulab_job_failed_timestamp_seconds",
    "gpulab_job_restarts_total",
    "gpulab_endpoint_requests_total",
    "gpulab_endpoint_latency_p99_seconds",
    "gpulab_endpoint_replica_restarts_total",
    "gpulab_endpoint_failed",
    "gpulab_quota_users_near_limit",
    "gpulab_disk_free_ratio",
}


@pytest.fixture(scope="module")
def rendered():
    values = {
        "jupyterhub": {"enabled": False},
        "alerts": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
    }
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="gpulab", namespace="gpulab", is_install=True)
        off = chart.render({"jupyterhub": {"enabled": False}}, name="gpulab", namespace="gpulab")
    docs = [d for text in out.values() if not text.startswith("NOTES") for d in _docs(text)]
    assert not [d for text in off.values() for d in _docs(text) if d["kind"] == "PrometheusRule"]
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    return rule


def _docs(text: str):
    try:
        return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError:  # NOTES.txt
        return []


def test_the_prometheus_rule_is_valid_offline(rendered):
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(rendered, K8S_VERSIONS[-1], strict=True)
    jsonschema.validate(rendered, PROMETHEUS_RULE)
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": rendered["metadata"]}
    assert validate_strict(meta) == K8S_VERSIONS
    assert rendered["metadata"]["name"] == "gpulab-alerts"
    assert rendered["metadata"]["labels"]["release"] == "kps"
    # A misspelt field fails the schema (the API server would drop it silently).
    broken = yaml.safe_load(yaml.safe_dump(rendered))
    broken["spec"]["groups"][0]["rules"][0]["fore"] = "5m"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUS_RULE)


def test_every_expression_parses_and_reads_exported_metrics(rendered):
    for rule in rendered["spec"]["groups"][0]["rules"]:
        expr = promql_parser.parse(rule["expr"])
        assert expr is not None, rule["alert"]
        names = set(re.findall(r"\b(gpulab_[a-z0-9_]+)", rule["expr"]))
        assert names and names <= EXPORTED, (rule["alert"], names - EXPORTED)
        # No Prometheus target label names a gpulab thing (it would become exported_job).
        assert not re.search(r"\b(job|instance)\s*[=!~]", rule["expr"]), rule["alert"]
    with pytest.raises(ValueError):
        promql_parser.parse("increase(gpulab_gpu_xid_errors_total[1h] > 0")  # the parser checks


def test_the_chart_and_the_service_name_the_same_rules(rendered):
    chart = [r["alert"] for r in rendered["spec"]["groups"][0]["rules"]]
    assert chart == [r.name for r in rules()] == list(RULE_NAMES) == SPEC_NAMES
    severities = {
        r["alert"]: r["labels"]["severity"] for r in rendered["spec"]["groups"][0]["rules"]
    }
    assert severities == {r.name: r.severity for r in rules()}
    # Thresholds reach the expressions (a site renders its own with its settings).
    stalled = {r.name: r for r in rules(Thresholds(job_stall_seconds=1800))}["JobStalled"]
    assert stalled.expr.endswith("> 1800")


def test_the_committed_rules_file_is_fresh():
    fresh = subprocess.run(
        [sys.executable, "-m", "gpulab.service.operations.rules"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert RULES_FILE.read_text() == fresh, (
        "regenerate it: python -m gpulab.service.operations.rules > "
        "helm/gpulab/files/alerts/prometheus-rules.yaml"
    )
    assert yaml.safe_load(fresh) == prometheus_rules()
