"""gpulab's Grafana dashboards (helm/gpulab/files/grafana/*.json), as Grafana imports them
and as the chart ships them.

- Each dashboard passes a strict schema of Grafana's dashboard model
  (grafana_dashboard_schema.py), its panels fit the 24-column grid, and every panel
  reads the ``datasource`` variable, so the files import anywhere.
- Every query parses with a PromQL parser (``promql-parser``: Prometheus' grammar), after
  Grafana's own interpolation of ``$__rate_interval`` and ``$__range``.
- Every series a query names is one gpulab or dcgm-exporter exports, and every label a
  query matches, groups by or joins on is one that series carries. gpulab's series
  are read from a real scrape: the service in this process (``support.service``) after
  some work (slices held, a job that waits, an endpoint, a node agent's sample), and
  the model server's own registry (``gpulab.serving.metrics``) after a request.
  dcgm-exporter cannot run here (no GPU): its series are the default counters it ships
  (:data:`DCGM_COUNTERS`) with the labels it writes (:data:`DCGM_LABELS`).
- The chart renders them as a ConfigMap for Grafana's dashboard sidecar, valid for
  every Kubernetes version the chart supports.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import jsonschema
import promql_parser as pq
import pytest
import torch
import yaml
from grafana_dashboard_schema import DASHBOARD
from kube.kube_helpers import K8S_VERSIONS, validate_strict
from prometheus_client.parser import text_string_to_metric_families
from support.service import running_service
from support.wait import wait_until_async

from gpulab.client.deployments import pack_model_dir
from gpulab.db.jobs import JobStore
from gpulab.serving.export import export_model
from gpulab.serving.metrics import ServingMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpulab"
FILES = sorted((CHART / "files" / "grafana").glob("*.json"))
DOC = ROOT / "docs" / "howto" / "grafana-dashboards.md"
DASHBOARDS = {p.name: json.loads(p.read_text()) for p in FILES}

#: dcgm-exporter's release whose ``etc/default-counters.csv`` the names come from.
DCGM_EXPORTER = "4.5.3-4.8.2"
#: The metrics of dcgm-exporter's etc/default-counters.csv at :data:`DCGM_EXPORTER`
#: (its ``label`` line, DCGM_FI_DRIVER_VERSION, becomes a label, not a series).
DCGM_COUNTERS = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]
#: The labels of a GPU's series (internal/pkg/rendermetrics/render_metrics.go at
#: :data:`DCGM_EXPORTER`; ``GPU_I_*`` on a MIG instance's, ``hostname`` unless
#: --no-hostname), the driver version label field, and the pod's on Kubernetes.
DCGM_LABELS = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "GPU_I_PROFILE"}
    | {"GPU_I_ID", "DCGM_FI_DRIVER_VERSION", "pod", "namespace", "container"}
)
#: What Grafana puts for its interval variables before it sends a query.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "6h"}
SIMULATE = "2xA100-80GB"
WAIT_S = 120  # a bound on a loaded 2-core machine, not a sleep


def panels(dashboard: dict) -> Iterator[dict]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row's


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


# -- the series gpulab and dcgm-exporter export --------------------------------------
def series_of(text: str, declared: dict[str, tuple] | None = None) -> dict[str, set]:
    """``{series name: label names}`` of a scrape. A family the scrape shows with no
    sample (a job's series with no job running) takes the label names its collector
    declared (``declared``)."""
    out: dict[str, set] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
        if family.samples:
            continue
        labels = set((declared or {}).get(family.name, ()))
        names = {
            "counter": [f"{family.name}_total"],
            "histogram": [f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"],
        }.get(family.type, [family.name])
        for name in names:
            out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def agent_sample(node: str, gpus: list[dict]) -> dict:
    """What a node agent sends (telemetry/agent.py): every field the exporter turns
    into a series, so each series shows with its labels."""
    whole = {"utilization_ratio": 0.5, "memory_utilization_ratio": 0.2, "power_watts": 200.0}
    return {
        "version": 1,
        "ts": time.time(),
        "node": node,
        "gpus": [
            {
                "index": g["index"],
                "uuid": g["uuid"],
                "name": g["model"],
                **whole,
                "memory_used_bytes": 2**30,
                "memory_total_bytes": 80 * 2**30,
                "temperature_celsius": 50.0,
                "energy_joules": 1000.0,
                "xid_errors_total": 0,
                "last_xid": 0,
                "ecc_uncorrected_errors_total": 0,
                "lost": False,
                "processes": [{"pid": 1234, "user": "alice", "memory_used_bytes": 2**30}],
                "mig": [{"gpu_instance_id": 1, "profile": "1g.10gb", "utilization_ratio": 0.1}],
            }
            for g in gpus
        ],
        "nics": [{"device": "eth0", "rx_bytes": 10, "tx_bytes": 20}],
        "rdma": [{"device": "mlx5_0", "port": 1, "rx_bytes": 10, "tx_bytes": 20}],
        "cache": {
            "hits": 3,
            "misses": 1,
            "bytes_from_cache": 30,
            "bytes_from_remote": 10,
            "evictions": 0,
            "prefetch_ahead": 1,
            "used": 40,
            "capacity": 100,
        },
        "allreduce": [
            {"job": "j1", "backend": "gloo", "size_bytes": 2**20, "busbw_bytes_per_second": 1e9}
        ],
        "missing": {},
    }


def tiny_model(tmp_path: Path) -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    export_model(model, torch.randn(2, 4), str(tmp_path), name="m", max_batch_size=4)
    return pack_model_dir(str(tmp_path))


async def scrape_after_work(tmp_path: Path) -> dict:
    """Run the service, give it work, and scrape it; return what a test checks."""
    config = "c.Alerting.alert_interval_seconds = 0.3\nc.UserAccounts.enabled = False\n"
    async with running_service(tmp_path / "svc", config, simulate=SIMULATE) as svc:
        alice = svc.create_user("alice")
        [node] = (await svc.request("GET", "/inventory")).json()["nodes"]
        free_before = (await svc.request("GET", "/../../metrics")).text
        # Every GPU held by a notebook server, so a job that asks a whole GPU waits. The
        # hub lists the servers as running, so the reconciler keeps their slices.
        for i, _gpu in enumerate(node["gpus"]):
            svc.fake_hub.users["alice"]["servers"][f"s{i}"] = {"ready": True}
            body = {"user": "alice", "owner_kind": "server", "owner": f"alice/s{i}"}
            r = await svc.request("POST", "/allocations", json={**body, "gpu_milli": 1000})
            assert r.status_code == 201, r.text
        job = {"code": "print('never runs here')", "name": "waits", "gpu_milli": 1000}
        r = await svc.request("POST", "/jobs", token=alice, json=job)
        assert r.status_code == 201, r.text
        waiting = r.json()
        # An endpoint scaled to zero (no replica starts): the router's series.
        spec = {"name": "m", "min_replicas": 0, "max_replicas": 1}
        r = await svc.request(
            "POST",
            "/deployments",
            token=alice,
            files={
                "spec": (None, json.dumps(spec)),
                "model": ("model.tar.gz", tiny_model(tmp_path / "model")),
            },
        )
        assert r.status_code == 201, r.text
        r = await svc.request("POST", "/telemetry", json=agent_sample(node["name"], node["gpus"]))
        assert r.status_code == 201, r.text

        async def after_an_alert_round():
            text = (await svc.request("GET", "/../../metrics")).text
            return "gpulab_endpoint_failed{" in text and text

        text = await wait_until_async(after_an_alert_round, "an alert round", WAIT_S, 0.3)
        declared = declared_labels(svc.app.metrics.registry)
        # The count a preemption writes on the job's row (service/jobs/manager.py):
        # preempting for real needs running ranks (tests/jobs covers it).
        JobStore(svc.app.engine).update(waiting["id"], preemptions=2)
        preempted = (await svc.request("GET", "/../../metrics")).text
        # Endpoints outlive the service (they keep answering across its restarts): stop
        # this one, or its replica would outlive the test.
        r = await svc.request("DELETE", "/deployments/m", token=alice)
        assert r.status_code in (200, 202, 204), r.text
        return {
            "node": node,
            "before": free_before,
            "text": text,
            "preempted": preempted,
            "declared": declared,
        }


def declared_labels(registry) -> dict[str, tuple]:
    """The label names each family of ``registry`` was made with. prometheus_client
    keeps them on the family (``_labelnames``) and writes them nowhere in the text
    format, which shows a family without samples by its name only."""
    return {f.name: tuple(getattr(f, "_labelnames", ())) for f in registry.collect()}


def model_server_text() -> str:
    """The model server's registry, filled as serving/server.py fills it per request."""
    m = ServingMetrics()
    m.requests.labels(model="m", code="200").inc()
    m.duration.labels(model="m").observe(0.02)
    m.batch_size.labels(model="m").observe(4)
    m.track_queue("m", lambda: 0)
    return m.render().decode()


@pytest.fixture(scope="module")
def scrape(tmp_path_factory) -> dict:
    return asyncio.run(scrape_after_work(tmp_path_factory.mktemp("grafana")))


@pytest.fixture(scope="module")
def exported(scrape) -> dict[str, frozenset]:
    """Every series a dashboard may read, with its labels."""
    out = series_of(scrape["text"], scrape["declared"])
    out.update(series_of(model_server_text()))
    for name in DCGM_COUNTERS:
        out[name] = DCGM_LABELS
    return {name: frozenset(labels) for name, labels in out.items()}


# -- what a query reads ---------------------------------------------------------------
def interpolate(expr: str) -> str:
    for var, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(var, value)
    return expr


class QueryCheck:
    """The series and labels one PromQL expression reads, each checked against
    ``exported``; ``problems`` says what would show no data."""

    def __init__(self, exported: dict[str, frozenset]):
        self.exported = exported
        self.problems: list[str] = []
        self.series: set[str] = set()
        self.variables: set[str] = set()

    def run(self, expr: str) -> QueryCheck:
        self.labels(pq.parse(interpolate(expr)))
        return self

    def labels(self, node) -> frozenset | None:
        """The label names of the series ``node`` gives (None: a scalar)."""
        if isinstance(node, pq.VectorSelector):
            return self.selector(node)
        if isinstance(node, pq.MatrixSelector):
            return self.selector(node.vector_selector)
        if isinstance(node, pq.ParenExpr | pq.UnaryExpr | pq.SubqueryExpr):
            return self.labels(node.expr)
        if isinstance(node, pq.NumberLiteral | pq.StringLiteral):
            return None
        if isinstance(node, pq.Call):
            return self.call(node)
        if isinstance(node, pq.AggregateExpr):
            return self.aggregate(node)
        if isinstance(node, pq.BinaryExpr):
            return self.binary(node)
        self.problems.append(f"no check for {type(node).__name__}")
        return frozenset()

    def selector(self, vs) -> frozenset:
        name = vs.name
        if name is None or name not in self.exported:
            self.problems.append(f"{name}: no exporter gives this series")
            return frozenset()
        self.series.add(name)
        labels = self.exported[name]
        for m in vs.matchers.matchers:
            if m.name not in labels:
                self.problems.append(f"{name} has no label {m.name!r} (it has {sorted(labels)})")
            for var in re.findall(r"\$\{?(\w+)", m.value):
                self.variables.add(var)
                if m.op != pq.MatchOp.Re:
                    self.problems.append(f"${var} in {m.name}{m.op}: a multi-value needs =~")
        return labels

    def call(self, node) -> frozenset | None:
        args = [self.labels(a) for a in node.args]
        name = node.func.name
        if name in ("time", "scalar", "vector"):
            return None if name != "vector" else frozenset()
        if name == "histogram_quantile":
            buckets = args[1] or frozenset()
            if "le" not in buckets:
                self.problems.append("histogram_quantile over series without 'le'")
            return buckets - {"le"}
        if name.startswith("label_"):
            self.problems.append(f"{name}: labels it makes are not checked; do without")
        return next((a for a in args if a is not None), None)

    def aggregate(self, node) -> frozenset:
        inner = self.labels(node.expr) or frozenset()
        if node.param is not None:
            self.labels(node.param)
        mod = node.modifier
        if mod is None:
            return frozenset()
        if mod.type == pq.AggModifierType.By:
            missing = set(mod.labels) - inner
            if missing:
                self.problems.append(f"by {sorted(missing)}: not a label of {sorted(inner)}")
            return frozenset(mod.labels)
        return inner - set(mod.labels)

    def binary(self, node) -> frozenset | None:
        lhs, rhs = self.labels(node.lhs), self.labels(node.rhs)
        if lhs is None or rhs is None:
            return rhs if lhs is None else lhs
        mod = node.modifier
        matching = mod.matching if mod is not None else None
        op = str(node.op)
        if matching is not None and matching.type == pq.LabelModifierType.Include:
            for side, labels in (("left", lhs), ("right", rhs)):
                missing = set(matching.labels) - labels
                if missing:
                    self.problems.append(f"on {sorted(missing)}: not on the {side} side")
        if op == "or":
            return lhs | rhs
        if op in ("and", "unless"):
            return lhs
        card = mod.card if mod is not None else None
        group = frozenset(mod.group_labels or []) if mod is not None else frozenset()
        if card == pq.VectorMatchCardinality.ManyToOne:
            return lhs | group
        if card == pq.VectorMatchCardinality.OneToMany:
            return rhs | group
        if matching is None and lhs != rhs:
            self.problems.append(
                f"{op}: the sides carry different labels ({sorted(lhs)} / {sorted(rhs)}), "
                "so no series would match; join with on(...)"
            )
        if matching is not None and matching.type == pq.LabelModifierType.Include:
            return frozenset(matching.labels)
        return lhs - set(matching.labels) if matching is not None else lhs


# -- the files as Grafana imports them -----------------------------------------------
def test_there_are_the_three_dashboards():
    assert sorted(DASHBOARDS) == [
        "gpulab-cluster.json",
        "gpulab-endpoints.json",
        "gpulab-usage.json",
    ]
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_passes_the_schema(name):
    dashboard = DASHBOARDS[name]
    jsonschema.Draft202012Validator(DASHBOARD).validate(dashboard)
    # A misspelt field (Grafana would drop it and show an empty panel) fails.
    broken = json.loads(json.dumps(dashboard))
    first = next(p for p in broken["panels"] if p["type"] != "row")
    first["tragets"] = first.pop("targets")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(DASHBOARD).validate(broken)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_and_every_one_has_a_query(name):
    dashboard = DASHBOARDS[name]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(set(ids)) == len(ids), "panel ids repeat"
    cells: set[tuple[int, int]] = set()
    for p in panels(dashboard):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_reads_the_datasource_variable(name):
    dashboard = DASHBOARDS[name]
    ds = variables(dashboard)["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"] == expected, p["title"]
        assert all(t["datasource"] == expected for t in p["targets"]), p["title"]
    for v in variables(dashboard).values():
        if v["type"] == "query":
            assert v["datasource"] == expected, v["name"]


# -- the queries, against what is exported ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_parses_and_reads_exported_series(name, exported):
    dashboard = DASHBOARDS[name]
    defined = set(variables(dashboard))
    read: set[str] = set()
    for title, expr in queries(dashboard):
        check = QueryCheck(exported).run(expr)
        assert not check.problems, (title, expr, check.problems)
        assert check.series, (title, "reads no series")
        assert check.variables <= defined, (title, check.variables - defined)
        read |= check.series
    # Nothing target labels name (Prometheus' job and instance differ per install).
    assert not any(re.search(r"\b(job|instance)\s*[=!~]", e) for _, e in queries(dashboard))
    assert read


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variables_list_exported_labels(name, exported):
    for v in variables(DASHBOARDS[name]).values():
        if v["type"] != "query":
            continue
        series, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", v["query"]).groups()
        assert label in exported[series], (v["name"], series, label)


@pytest.mark.slow
def test_the_cluster_dashboard_reads_gpulab_and_dcgm_together(exported):
    read = set()
    for _, expr in queries(DASHBOARDS["gpulab-cluster.json"]):
        read |= QueryCheck(exported).run(expr).series
    for name in ("gpulab_slices_held", "gpulab_slices_free", "gpulab_jobs_queued"):
        assert name in read
    assert "gpulab_job_preemptions_total" in read and "DCGM_FI_DEV_GPU_UTIL" in read
    # The two exporters share the labels the GPU panels group and join by.
    for label in ("hostname", "gpu", "UUID"):
        assert label in exported["DCGM_FI_DEV_GPU_UTIL"]
        assert label in exported["gpulab_gpu_utilization_ratio"]


@pytest.mark.slow
def test_the_check_refuses_what_would_show_no_data(exported):
    bad = {
        "gpulab_gpu_util": "no exporter gives this series",
        'gpulab_slices_free{node="a"}': "has no label 'node'",
        "sum by (user) (gpulab_gpu_seconds_total)": "by ['user']",
        "DCGM_FI_DEV_GPU_UTIL / gpulab_gpu_utilization_ratio": "the sides carry different",
        "gpulab_gpu_allocated_ratio and on (pod) gpulab_gpu_lost": "not on the left side",
        'gpulab_slices_free{hostname="$node"}': "a multi-value needs =~",
        "histogram_quantile(0.9, sum by (model) (rate(gpulab_serving_batch_size_bucket[5m])))": (
            "without 'le'"
        ),
    }
    for expr, problem in bad.items():
        problems = QueryCheck(exported).run(expr).problems
        assert any(problem in p for p in problems), (expr, problems)
    with pytest.raises(ValueError):
        pq.parse("sum by (le (rate(gpulab_placement_duration_seconds_bucket[5m]))")


# -- the series the dashboards added to the service ---------------------------------
def value(text: str, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


@pytest.mark.slow
def test_slices_held_and_free_and_the_queue_are_exported(scrape):
    node, before, after = scrape["node"]["name"], scrape["before"], scrape["text"]
    # Two whole A100s free: 20 slices of 1/10, 8 of 1/4, 4 of 1/2, 2 whole, 1 of two.
    free = {m: value(before, "gpulab_slices_free", hostname=node, milli=m) for m in ("100", "250")}
    assert free == {"100": 20, "250": 8}
    assert value(before, "gpulab_slices_free", hostname=node, milli="2000") == 1
    assert value(before, "gpulab_slices_held", hostname=node) is None
    # Both held by servers: none free of any size, two rows of 1000 held.
    assert value(after, "gpulab_slices_free", hostname=node, milli="100") == 0
    held = value(after, "gpulab_slices_held", hostname=node, milli="1000", owner_kind="server")
    assert held == 2
    # The job that asked a whole GPU waits, in its class.
    assert value(after, "gpulab_jobs_queued", priority_class="batch") == 1
    assert value(after, "gpulab_job_queue_oldest_wait_seconds", priority_class="batch") >= 0
    assert value(after, "gpulab_job_preemptions_total", priority_class="batch") == 0
    assert value(scrape["preempted"], "gpulab_job_preemptions_total", priority_class="batch") == 2


# -- the chart ships them -------------------------------------------------------------
@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(str(CHART)) as c:
        yield c


def rendered_configmaps(chart, values: dict) -> list[dict]:
    out = chart.render(
        {"jupyterhub": {"enabled": False}, **values}, name="gpulab", namespace="gpulab"
    )
    docs = []
    for path, text in out.items():
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d and d["kind"] == "ConfigMap"]
    return [d for d in docs if d["metadata"]["name"].endswith("-grafana-dashboards")]


def test_the_chart_renders_the_dashboards_for_grafanas_sidecar(chart):
    assert rendered_configmaps(chart, {}) == []  # off by default
    on = {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPU"}}}
    [cm] = rendered_configmaps(chart, {"grafana": on})
    assert validate_strict(cm) == K8S_VERSIONS
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert cm["metadata"]["namespace"] == "gpulab"
    # Each file, byte for byte.
    assert {k: json.loads(v) for k, v in cm["data"].items()} == DASHBOARDS
    # A sidecar that watches another label, in another namespace.
    own = {"enabled": True, "label": "example.com/dashboard", "labelValue": "gpu"}
    [cm] = rendered_configmaps(chart, {"grafana": {"dashboards": {**own, "namespace": "mon"}}})
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "gpu"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "mon"
    assert validate_strict(cm) == K8S_VERSIONS


def test_the_values_schema_refuses_a_bad_label(chart):
    bad = {"grafana": {"dashboards": {"enabled": True, "label": "grafana dashboard"}}}
    with pytest.raises(helm.HelmError, match="at '/grafana/dashboards/label'"):
        chart.validate_schema({"jupyterhub": {"enabled": False}, **bad})
    with pytest.raises(helm.HelmError, match="additional properties 'enable' not allowed"):
        chart.validate_schema({"jupyterhub": {"enabled": False}, "grafana": {"enable": True}})


def test_the_docs_describe_every_dashboard_and_panel():
    text = DOC.read_text()
    for name, dashboard in DASHBOARDS.items():
        assert f"helm/gpulab/files/grafana/{name}" in text, name
        for p in panels(dashboard):
            if p["type"] != "row":
                assert p["title"] in text, (name, p["title"])
