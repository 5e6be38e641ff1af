"""What the MLflow proxy checks before MLflow sees a request (pure: no hub, no MLflow)."""

from __future__ import annotations

import json

import pytest

from gpulab.service.experiments.graphql_check import Unchecked, targets
from gpulab.service.experiments.ownership import namespaced, owner_filter, with_owner_tag
from gpulab.service.experiments.proxy import MlflowBackend, plain_path
from gpulab.service.experiments.surface import OWNER_TAG, classify
from gpulab.service.experiments.tracking_server import server_argv, server_env, store_uri

GET_RUN = (
    "query GetRun($data: MlflowGetRunInput!) "
    "{ mlflowGetRun(input: $data) { run { info { runUuid } } } }"
)


@pytest.mark.parametrize(
    ("method", "path", "args", "body", "kind", "experiments", "runs"),
    [
        ("POST", "api/2.0/mlflow/runs/log-batch", {}, {"run_id": "r1"}, "runs", (), ("r1",)),
        ("GET", "api/2.0/mlflow/runs/get", {"run_uuid": ["r2"]}, {}, "runs", (), ("r2",)),
        (
            "POST",
            "ajax-api/2.0/mlflow/runs/search",
            {},
            {"experiment_ids": ["1", "2"]},
            "experiments",
            ("1", "2"),
            (),
        ),
        (
            "GET",
            "ajax-api/2.0/mlflow/metrics/get-history-bulk-interval",
            {"run_ids": ["a", "b"]},
            {},
            "runs",
            (),
            ("a", "b"),
        ),
        (
            "GET",
            "api/2.0/mlflow/experiments/get",
            {"experiment_id": ["7"]},
            {},
            "experiments",
            ("7",),
            (),
        ),
        (
            "PUT",
            "api/2.0/mlflow-artifacts/artifacts/3/abc/artifacts/model.pt",
            {},
            {},
            "artifact",
            ("3",),
            (),
        ),
        (
            "GET",
            "api/2.0/mlflow-artifacts/artifacts",
            {"path": ["4/abc/artifacts"]},
            {},
            "artifact",
            ("4",),
            (),
        ),
        ("GET", "get-artifact", {"run_uuid": ["r3"], "path": ["x"]}, {}, "runs", (), ("r3",)),
        ("POST", "runs/create", {}, {}, "refuse", (), ()),  # not under an API root
        ("POST", "api/2.0/mlflow/runs/create", {}, {}, "create_run", (), ()),
        ("GET", "", {}, {}, "open", (), ()),
        ("GET", "static-files/static/js/main.js", {}, {}, "open", (), ()),
    ],
)
def test_each_route_names_what_it_touches(method, path, args, body, kind, experiments, runs):
    check = classify(method, path, args, body)
    assert (check.kind, check.experiments, check.runs) == (kind, experiments, runs)


@pytest.mark.parametrize(
    "path",
    [
        "api/2.0/mlflow/registered-models/search",
        "api/2.0/mlflow/logged-models/m-1",
        "api/2.0/mlflow/runs/outputs",  # links logged models (anyone's) to a run
        "api/3.0/mlflow/traces/search",
        "api/3.0/mlflow/gateway/secrets/list",
        "api/2.0/mlflow/webhooks",
        "api/2.0/mlflow/runs/log-batch",  # no run named
        "api/2.0/mlflow-artifacts/artifacts/../../etc/passwd",  # no experiment named
        "api/2.0/mlflow-artifacts/mpu/create/1/abc",
        "some-route-of-a-later-mlflow",
    ],
)
def test_what_cannot_be_checked_is_refused(path):
    assert classify("POST", path, {}, {}).kind == "refuse"


def test_a_run_cannot_link_logged_models():
    own = {"run_id": "r1", "models": [{"model_id": "m-of-alice"}]}
    for route in ("runs/outputs", "runs/log-inputs"):
        check = classify("POST", f"api/2.0/mlflow/{route}", {}, own)
        assert check.kind == "refuse" and "logged models" in check.why, (route, check)
    datasets = {"run_id": "r1", "datasets": [{"dataset": {"name": "d"}}]}
    assert classify("POST", "api/2.0/mlflow/runs/log-inputs", {}, datasets).runs == ("r1",)


def test_graphql_queries_name_their_runs_and_experiments():
    assert targets({"query": GET_RUN, "variables": {"data": {"runId": "r9"}}}) == ((), ("r9",))
    query = '{ a: mlflowSearchRuns(input: {experimentIds: ["1"]}) { nextPageToken } }'
    assert targets({"query": query}) == (("1",), ())
    for body, why in [
        ({"query": "mutation { mlflowSomething(input: {}) { x } }"}, "only GraphQL queries"),
        ({"query": "{ mlflowSearchModelVersions(input: {}) { x } }"}, "not offered"),
        ({"query": "{ __schema { types { name } } }"}, "not offered"),
        ({"query": GET_RUN, "variables": {"data": {}}}, "must name its runs"),
        ({"query": "{ mlflowGetRun("}, "does not parse"),
        # Parsed on the proxy's event loop: 880 KB of root fields took it 2.2 s.
        ({"query": "{" + "mlflowGetRun(input: {runId: 1}) { x } " * 3000 + "}"}, "at most 64 KiB"),
        ({"query": "{" + "mlflowGetRun(input: {runId: 1}) { x } " * 1000 + "}"}, "2000 tokens"),
    ]:
        with pytest.raises(Unchecked, match=why):
            targets(body)
    assert classify(
        "POST", "graphql", {}, {"query": GET_RUN, "variables": {"data": {"runId": "r"}}}
    ).runs == ("r",)


def test_names_and_tags_are_the_owners():
    assert namespaced("alice", "demo") == "alice/demo"
    assert namespaced("alice", "alice/demo") == "alice/demo"
    assert namespaced("bob", "alice/demo") == "bob/alice/demo"
    assert owner_filter("alice") == f"tags.`{OWNER_TAG}` = 'alice'"
    assert (
        owner_filter("alice", "name LIKE 'x%'")
        == f"tags.`{OWNER_TAG}` = 'alice' AND name LIKE 'x%'"
    )
    # A user's own value for the owner tag is dropped, theirs set.
    tags = with_owner_tag([{"key": OWNER_TAG, "value": "bob"}, {"key": "k", "value": "v"}], "alice")
    assert tags == [{"key": "k", "value": "v"}, {"key": OWNER_TAG, "value": "alice"}]


def test_the_store_follows_the_sites_database(tmp_path):
    assert store_uri(str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow/mlflow.sqlite"
    pg = store_uri(
        str(tmp_path), "postgresql://gpulab:pw@db.example.org:5432/gpulab?sslmode=require"
    )
    assert pg == (
        "postgresql+psycopg://gpulab:pw@db.example.org:5432/gpulab"
        "?sslmode=require&options=-csearch_path%3Dmlflow"
    )


def test_a_path_reaches_what_was_checked():
    assert plain_path("api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/model.pt")
    assert plain_path("") and plain_path("static-files/")
    for bad in ("api/2.0/mlflow-artifacts/artifacts/1/../2/x", "a/./b", "a//b"):
        assert not plain_path(bad)
    # Quoted again on the way to MLflow: an artifact named "a?b" is not a query.
    url = MlflowBackend(None, "/services/mlflow/").url("api/2.0/mlflow-artifacts/artifacts/1/r/a?b")
    assert url == "http://localhost/services/mlflow/api/2.0/mlflow-artifacts/artifacts/1/r/a%3Fb"


def test_every_id_a_request_carries_is_checked():
    """MLflow's get-artifact reads run_id before run_uuid: both are checked, whichever
    the proxy or MLflow would read first."""
    check = classify("GET", "get-artifact", {"run_uuid": ["mine"], "run_id": ["theirs"]}, {})
    assert set(check.runs) == {"mine", "theirs"}
    check = classify("GET", "api/2.0/mlflow/runs/get", {"run_id": ["mine", "theirs"]}, {})
    assert set(check.runs) == {"mine", "theirs"}
    check = classify(
        "POST", "api/2.0/mlflow/runs/update", {"run_id": ["theirs"]}, {"run_id": "mine"}
    )
    assert set(check.runs) == {"mine", "theirs"}
    assert (
        classify(
            "POST", "api/2.0/mlflow/runs/create", {"experiment_id": ["2"]}, {"experiment_id": "1"}
        ).kind
        == "refuse"
    )


def test_mlflows_server_gets_no_credentials_of_the_hub_and_shows_none():
    store = "postgresql+psycopg://gpulab:pw@db/gpulab"
    env = server_env(store, {"PATH": "/usr/bin", "JUPYTERHUB_API_TOKEN": "t", "GPULAB_DB_URL": "x"})
    assert env["PATH"] == "/usr/bin" and env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert not [k for k in env if k.startswith(("JUPYTERHUB_", "GPULAB_"))]
    # The store (its password) in the environment only: anyone may read a command line.
    assert env["MLFLOW_BACKEND_STORE_URI"] == store
    assert not [a for a in server_argv("/srv/art", "/srv/run/s.sock", "/p/") if "pw" in a]


def test_a_jobs_reports_become_metrics_and_its_flags_params(tmp_path):
    from gpulab.backend.jobdir import JobDir
    from gpulab.service.experiments.recorder import job_params, read_reports, run_metrics

    jd = JobDir(str(tmp_path), "j1")
    (tmp_path / "j1" / "metrics").mkdir(parents=True)
    (tmp_path / "j1" / "metrics" / "rank0.jsonl").write_text(
        '{"time": 1.5, "rank": 0, "step": 3, "loss": 0.5, "note": "x", "ok": true}\n'
        '{"time": 2.0, "rank": 0, "loss": "nan"}\n'
        '{"time": 2.5, "loss": 0.25'  # a line still being written
    )
    metrics = run_metrics(read_reports(jd))
    assert metrics == [{"key": "loss", "value": 0.5, "timestamp": 1500, "step": 3}]
    # The file is the rank's (its user's) to write: an odd time or step is not an error
    # that loses the run's other metrics.
    odd = [{"time": "soon", "loss": 1.0}, {"time": 1e308, "step": True, "loss": 2.0}]
    odd.append({"loss": 10**400, "time": 10**400})  # no float holds it: no OverflowError
    assert [(m["timestamp"], m["step"]) for m in run_metrics(odd)] == [(0, 0), (0, 1)]
    # A line of thousands of keys, many times: the first MAX_RUN_METRICS values only
    # (32 MiB of them made 4 million dicts in the service, 1.2 GB).
    wide = json.dumps({f"k{i}": 1 for i in range(5000)}) + "\n"
    (tmp_path / "j1" / "metrics" / "rank0.jsonl").write_text(wide * 100)
    assert len(run_metrics(read_reports(jd), most=20_000)) == 20_000
    params = job_params({"nodes": 2, "out": "model", "env": {"SECRET": "s"}, "code": "x=1"})
    assert params == [{"key": "nodes", "value": "2"}, {"key": "out", "value": "model"}]
