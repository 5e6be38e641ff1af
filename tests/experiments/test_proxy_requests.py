"""The MLflow proxy's handler on requests MLflow reads differently from the checks: an id
under MLflow's camelCase name, a POST's query, a body nested past Python's limit, a
query that is not UTF-8, an answer too large to narrow; and the service's token never
sent to a port another account took.

The proxy runs in-process (the hub's login replaced by a token naming the user); the
MLflow of :func:`real_mlflow` is MLflow's own server on SQLite, as ``gpulab up`` starts it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets, bind_unix_socket

from gpulab.service.experiments.ownership import Owners, owner_filter
from gpulab.service.experiments.proxy import (
    NARROW_LIMIT,
    MlflowBackend,
    ProxyHandler,
    Refused,
    created_since,
    parse_body,
    query_args,
)
from gpulab.service.experiments.surface import OWNER_TAG, classify
from gpulab.service.experiments.tracking_server import TrackingServer

PREFIX = "/services/mlflow/"
API = "api/2.0/mlflow"


class FakeHubAuth:
    """The hub's answer to ``Authorization: token <name>``: that user
    (``token service:<name>``: that service)."""

    access_scopes: set = set()

    async def get_user(self, handler, sync=True):
        auth = handler.request.headers.get("Authorization", "")
        if not auth.startswith("token "):
            return None
        name = auth.split()[-1]
        if name.startswith("service:"):
            return {"name": name.removeprefix("service:"), "kind": "service"}
        return {"name": name, "kind": "user"}

    def check_scopes(self, scopes, model):
        return True


class Handler(ProxyHandler):
    _hub_auth = FakeHubAuth()


#: The hub users' ``created``, by name (a user not here has none in their model).
CREATED: dict[str, str] = {}


class FakeHub:
    async def user(self, name):
        model = {"name": name, "admin": name == "admin"}
        if name in CREATED:
            model["created"] = CREATED[name]
        return model


def proxy_settings(backend) -> SimpleNamespace:
    return SimpleNamespace(
        service_name="mlflow",
        trusted_services=["gpulab"],
        hub=FakeHub(),
        max_upload_mib=16,
        backend=backend,
        owners=Owners(backend.call) if backend is not None else None,
    )


async def serve(backend) -> tuple[HTTPServer, str]:
    """The proxy's handler in front of ``backend`` on a loopback port: its base URL."""
    app = web.Application(
        [(f"{PREFIX}(.*)", Handler)], mlflow_proxy=proxy_settings(backend), xsrf_cookies=False
    )
    server = HTTPServer(app, max_body_size=32 << 20)
    [sock] = bind_sockets(0, "127.0.0.1")
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}{PREFIX}"


async def call(
    base: str, user: str, method: str, path: str, body=None, raw=None, on_behalf: str = ""
):
    """``(status, json)`` of one request as ``user`` (a service, for ``on_behalf``)."""
    if raw is None and body is not None:
        raw = json.dumps(body).encode()
    headers = {"Authorization": f"token {user}", "Content-Type": "application/json"}
    if on_behalf:
        headers["X-Gpulab-User"] = on_behalf
    resp = await AsyncHTTPClient().fetch(
        HTTPRequest(
            base + path,
            method=method,
            headers=headers,
            body=raw,
            allow_nonstandard_methods=True,
            request_timeout=120,
        ),
        raise_error=False,
    )
    try:
        return resp.code, json.loads(resp.body or b"{}")
    except ValueError:
        return resp.code, {"raw": resp.body[:200]}


# -- what the checks read ------------------------------------------------------------


def test_a_body_names_its_fields_in_snake_case():
    """MLflow takes ``runId`` for ``run_id`` (its protobuf JSON names): any top-level key
    not in snake_case is refused, so no id hides under a name the checks do not read."""
    assert parse_body(b'{"run_id": "r", "metrics": [{"key": "k"}]}') == {
        "run_id": "r",
        "metrics": [{"key": "k"}],
    }
    for body in (
        {"runId": "theirs", "run_uuid": "mine"},
        {"experimentIds": ["1"]},
        {"name": "x", "artifactLocation": "/home/gpulab-alice/x"},
        {"experiment_id": "1", "newName": "elsewhere"},
        {"": 1},
    ):
        with pytest.raises(Refused, match="snake_case") as refused:
            parse_body(json.dumps(body).encode())
        assert refused.value.status == 400
    # GraphQL's body is checked by its own reader (its inputs are camelCase).
    assert parse_body(b'{"query": "{ x }", "operationName": null}', graphql=True)


def test_the_ids_checked_are_the_ones_mlflow_reads():
    """MLflow reads a GET's query and any other method's JSON body
    (``_get_request_message``): a POST whose ids are only in its query names nothing
    MLflow acts on, and is refused; every id the request carries is still checked."""
    for route, query in (
        ("runs/delete", {"run_id": ["mine"]}),
        ("runs/search", {"experiment_ids": ["1"]}),
        ("experiments/delete", {"experiment_id": ["1"]}),
    ):
        assert classify("POST", f"{API}/{route}", query, {}).kind == "refuse", route
    check = classify(
        "POST", f"{API}/runs/search", {"experiment_ids": ["1"]}, {"experiment_ids": ["2"]}
    )
    assert set(check.experiments) == {"1", "2"}
    check = classify("GET", f"{API}/runs/get", {"run_id": ["r1"]}, {})
    assert check.runs == ("r1",)


def test_a_hub_users_created_time_limits_their_experiments():
    """``created`` as the hub writes it (UTC, with or without its zone) in ms; none,
    no limit. The search filter adds it with AND, as MLflow's grammar reads it."""
    assert created_since({"created": "2024-05-01T00:00:00.5Z"}) == 1714521600500
    assert created_since({"created": "2024-05-01T00:00:00.5"}) == 1714521600500
    assert created_since({"created": "2024-05-01T02:00:00.5+02:00"}) == 1714521600500
    assert created_since({}) is None and created_since({"created": None}) is None
    with pytest.raises(Refused):
        created_since({"created": "yesterday"})
    search_utils = pytest.importorskip("mlflow.utils.search_utils")
    assert search_utils.SearchExperimentsUtils.parse_search_filter(
        owner_filter("alice", "name LIKE 'a%'", 1714521600500)
    ) == [
        {"type": "tag", "key": OWNER_TAG, "comparator": "=", "value": "alice"},
        {"type": "attribute", "key": "creation_time", "comparator": ">=", "value": 1714521600500},
        {"type": "attribute", "key": "name", "comparator": "LIKE", "value": "a%"},
    ]
    assert owner_filter("alice") == f"tags.`{OWNER_TAG}` = 'alice'"


def test_the_query_must_be_utf8_and_the_body_json():
    assert query_args({"a": [b"b"]}) == {"a": ["b"]}
    with pytest.raises(Refused, match="UTF-8"):
        query_args({"a": [b"\xff"]})
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a": ' + b"[" * 100_000, b"{nope"):
        with pytest.raises(Refused, match="must be JSON"):
            parse_body(raw)


async def test_a_bad_query_or_a_deep_body_is_answered_400_not_500():
    server, base = await serve(None)  # refused before MLflow would be asked
    try:
        status, said = await call(base, "alice", "GET", f"{API}/runs/get?run_id=%ff")
        assert status == 400 and "UTF-8" in said["message"], said
        deep = b'{"run_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        status, said = await call(base, "alice", "POST", f"{API}/runs/update", raw=deep)
        assert status == 400 and "JSON" in said["message"], said
        status, said = await call(base, "alice", "POST", f"{API}/runs/delete", {"runId": "x"})
        assert status == 400 and "snake_case" in said["message"], said
    finally:
        server.stop()


# -- an answer too large to narrow ---------------------------------------------------


class FakeMlflow(web.RequestHandler):
    """experiments/search as MLflow would answer it, ``count`` experiments of alice's
    and one of bob's."""

    def get(self, route):
        count = int(self.settings["count"])
        tag = {"key": OWNER_TAG, "value": "alice"}
        exps = [{"experiment_id": "0", "name": "alice/" + "x" * 200, "tags": [tag]}] * count
        exps.append({"experiment_id": "b", "tags": [{"key": OWNER_TAG, "value": "bob"}]})
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"experiments": exps}))


@pytest.fixture
async def fake_mlflow(tmp_path):
    sock_path = str(tmp_path / "mlflow.sock")
    app = web.Application([(f"{PREFIX}api/2.0/mlflow/(.*)", FakeMlflow)], count=1)
    server = HTTPServer(app)
    server.add_socket(bind_unix_socket(sock_path))

    class Tracking:
        async def ready(self):
            return sock_path

    backend = MlflowBackend(Tracking(), PREFIX)
    proxy, base = await serve(backend)
    yield app, base
    proxy.stop()
    server.stop()
    await backend.close()


async def test_a_search_answer_too_large_to_narrow_asks_for_less(fake_mlflow):
    app, base = fake_mlflow
    status, said = await call(base, "alice", "GET", f"{API}/experiments/search")
    assert status == 200 and [e["experiment_id"] for e in said["experiments"]] == ["0"]
    # Read whole and parsed on the proxy's event loop, whatever its size: now capped.
    app.settings["count"] = NARROW_LIMIT // 200
    status, said = await call(base, "alice", "GET", f"{API}/experiments/search?max_results=50000")
    assert status == 400 and "max_results" in said["message"], said


# -- MLflow's own server -------------------------------------------------------------


@pytest.fixture(scope="module")
async def real_mlflow(tmp_path_factory):
    """MLflow's server (SQLite) behind the proxy's handler: its base URL."""
    tracking = TrackingServer(str(tmp_path_factory.mktemp("mlflow")), "", PREFIX)
    backend = MlflowBackend(tracking, PREFIX)
    proxy, base = await serve(backend)
    try:
        yield base
    finally:
        proxy.stop()
        await backend.close()
        await tracking.stop()


async def experiment_and_run(base: str, user: str) -> tuple[str, str]:
    status, made = await call(base, user, "POST", f"{API}/experiments/create", {"name": "demo"})
    assert status == 200, made
    exp = made["experiment_id"]
    status, run = await call(base, user, "POST", f"{API}/runs/create", {"experiment_id": exp})
    assert status == 200, run
    return exp, run["run"]["info"]["run_id"]


@pytest.fixture(scope="module")
async def owned(real_mlflow):
    """Alice's and bob's experiment and run: ``{user: (experiment_id, run_id)}``."""
    return {u: await experiment_and_run(real_mlflow, u) for u in ("alice", "bob")}


@pytest.mark.slow
async def test_bob_cannot_reach_alices_run_under_camelcase_names(real_mlflow, owned):
    base = real_mlflow
    (alice_exp, alice_run), (bob_exp, bob_run) = owned["alice"], owned["bob"]
    # Checked: his run_uuid; acted on by MLflow: runId (hers).
    for route, extra in (
        ("runs/delete", {}),
        ("runs/set-tag", {"key": "stolen", "value": "yes"}),
        ("runs/log-metric", {"key": "loss", "value": 99.0, "timestamp": 0}),
        ("runs/log-parameter", {"key": "p", "value": "bob"}),
        ("runs/update", {"status": "KILLED"}),
    ):
        body = {"runId": alice_run, "run_uuid": bob_run, **extra}
        status, said = await call(base, "bob", "POST", f"{API}/{route}", body)
        assert status == 400 and "snake_case" in said["message"], (route, said)
    # Checked: the query (his experiment); read by MLflow: the body (hers).
    status, said = await call(
        base,
        "bob",
        "POST",
        f"{API}/runs/search?experiment_ids={bob_exp}",
        {"experimentIds": [alice_exp]},
    )
    assert status == 400 and "runs" not in said, said
    status, said = await call(
        base, "bob", "POST", f"{API}/runs/search?experiment_ids={bob_exp}", {"max_results": 10}
    )
    assert status == 403 and "needs experiment_ids" in said["message"], said
    # Nothing of his reached her run.
    status, seen = await call(base, "alice", "GET", f"{API}/runs/get?run_id={alice_run}")
    assert status == 200 and seen["run"]["info"]["lifecycle_stage"] == "active", seen
    assert seen["run"]["info"]["status"] == "RUNNING"
    assert "stolen" not in {t["key"] for t in seen["run"]["data"].get("tags", [])}
    assert not seen["run"]["data"].get("metrics") and not seen["run"]["data"].get("params")
    # Her own calls, in MLflow's names, still work.
    status, said = await call(
        base,
        "alice",
        "POST",
        f"{API}/runs/set-tag",
        {"run_id": alice_run, "key": "k", "value": "v"},
    )
    assert status == 200, said
    status, found = await call(
        base, "alice", "POST", f"{API}/runs/search", {"experiment_ids": [alice_exp]}
    )
    assert status == 200 and [r["info"]["run_id"] for r in found["runs"]] == [alice_run]
    status, said = await call(base, "alice", "POST", f"{API}/runs/delete", {"run_id": alice_run})
    assert status == 200, said
    status, said = await call(base, "alice", "POST", f"{API}/runs/restore", {"run_id": alice_run})
    assert status == 200, said
    # His own, too.
    status, said = await call(base, "bob", "POST", f"{API}/runs/delete", {"run_id": bob_run})
    assert status == 200, said


@pytest.mark.slow
async def test_an_experiments_artifact_location_is_gpulabs_under_either_name(real_mlflow, owned):
    base = real_mlflow
    for key in ("artifactLocation", "artifact_location"):
        body = {"name": f"elsewhere-{key}", key: "/home/gpulab-bob/link"}
        status, said = await call(base, "bob", "POST", f"{API}/experiments/create", body)
        assert status == 400, (key, said)
        status, said = await call(
            base,
            "admin",
            "GET",
            f"{API}/experiments/get-by-name?experiment_name=bob/elsewhere-{key}",
        )
        assert status == 404, (key, said)  # never made
    # A rename out of his namespace under the camelCase name neither.
    bob_exp = owned["bob"][0]
    body = {"experiment_id": bob_exp, "newName": "alice/taken"}
    status, said = await call(base, "bob", "POST", f"{API}/experiments/update", body)
    assert status == 400 and "snake_case" in said["message"], said
    status, seen = await call(base, "bob", "GET", f"{API}/experiments/get?experiment_id={bob_exp}")
    assert status == 200 and seen["experiment"]["name"] == "bob/demo", seen


@pytest.mark.slow
async def test_a_new_hub_user_of_a_name_reaches_nothing_the_old_one_left(real_mlflow):
    """A hub user deleted, a new one made with the same name: the experiments and runs
    the first one left (tagged with the name) are not the new one's, nor do they block
    the new one's own ``demo`` or ``Default``. The service's runs for the new one
    neither."""
    base, user = real_mlflow, "erin"
    old_exp, old_run = await experiment_and_run(base, user)
    status, said = await call(base, user, "POST", f"{API}/runs/create", {})
    assert status == 200, said
    old_default = said["run"]["info"]["experiment_id"]
    await asyncio.sleep(0.01)
    # erin is deleted, and a new erin made.
    CREATED[user] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    try:
        for method, route, body in (
            ("GET", f"experiments/get?experiment_id={old_exp}", None),
            ("GET", "experiments/get-by-name?experiment_name=demo", None),
            ("GET", f"runs/get?run_id={old_run}", None),
            ("GET", f"artifacts/list?run_id={old_run}", None),
            ("POST", "runs/search", {"experiment_ids": [old_exp]}),
            (
                "POST",
                "runs/log-metric",
                {"run_id": old_run, "key": "k", "value": 1, "timestamp": 0},
            ),
            ("POST", "runs/create", {"experiment_id": old_exp}),
            ("POST", "runs/delete", {"run_id": old_run}),
            ("POST", "experiments/delete", {"experiment_id": old_exp}),
            ("POST", "experiments/update", {"experiment_id": old_exp, "new_name": "mine"}),
        ):
            status, said = await call(base, user, method, f"{API}/{route}", body)
            assert status == 404, (route, said)
        status, said = await call(
            base, user, "GET", f"api/2.0/mlflow-artifacts/artifacts/{old_exp}/{old_run}/x"
        )
        assert status == 404, said
        query = (
            "query q($d: MlflowGetRunInput) { mlflowGetRun(input: $d) { run { info { runId } } } }"
        )
        body = {"query": query, "variables": {"d": {"runId": old_run}}}
        status, said = await call(base, user, "POST", "graphql", body)
        assert status == 404, said
        for method, search, body in (
            ("GET", "experiments/search?max_results=100", None),
            ("POST", "experiments/search", {"max_results": 100, "filter": "name LIKE 'erin/%'"}),
        ):
            status, said = await call(base, user, method, f"{API}/{search}", body)
            assert status == 200 and not said.get("experiments"), said
        # The service writing for the new erin: the old run is not hers either.
        metric = {"run_id": old_run, "key": "k", "value": 1, "timestamp": 0}
        status, said = await call(
            base, "service:gpulab", "POST", f"{API}/runs/log-metric", metric, on_behalf=user
        )
        assert status == 404, said

        # Her own demo and Default are new ones; the old ones are set aside by name.
        new_exp, new_run = await experiment_and_run(base, user)
        assert new_exp != old_exp
        status, said = await call(base, user, "POST", f"{API}/runs/create", {})
        assert status == 200 and said["run"]["info"]["experiment_id"] != old_default
        new_default = said["run"]["info"]["experiment_id"]
        metric = {"run_id": new_run, "key": "k", "value": 1, "timestamp": 0}
        status, said = await call(
            base, "service:gpulab", "POST", f"{API}/runs/log-metric", metric, on_behalf=user
        )
        assert status == 200, said
        status, said = await call(base, user, "GET", f"{API}/experiments/search?max_results=100")
        assert status == 200, said
        assert {e["experiment_id"] for e in said["experiments"]} == {new_exp, new_default}
        status, said = await call(
            base, user, "POST", f"{API}/runs/search", {"experiment_ids": [new_exp]}
        )
        assert [r["info"]["run_id"] for r in said["runs"]] == [new_run], said
        status, said = await call(
            base, user, "GET", f"{API}/experiments/get-by-name?experiment_name=demo"
        )
        assert status == 200 and said["experiment"]["experiment_id"] == new_exp, said
        # An admin still sees the old one, renamed aside.
        status, said = await call(
            base, "admin", "GET", f"{API}/experiments/get?experiment_id={old_exp}"
        )
        assert status == 200 and said["experiment"]["name"].startswith("erin/demo (before "), said
    finally:
        del CREATED[user]
