"""Deployments end to end: a real hub, the gpulab service, real model-server
replicas, and ``tritonclient.http`` (not our client) calling through the hub.

Only the GPUs are declared (``--simulate-gpus``): slices are placed and
accounted for by the ledger, the replicas run on CPU.
"""

import os
import signal

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as httpclient
from hubproc import replica_pids
from support.wait import wait_until
from tritonclient.utils import InferenceServerException

from gpulab.client import Client, GpuLabError
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: hub.create_user(u) for u in ("alice", "bob", "carol")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    path = tmp_path_factory.mktemp("model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="ignored", max_batch_size=8)
    return str(path), model


def client(hub, token) -> Client:
    return Client(hub.api, token=token)


def wait_state(hub, token, name, state="running", **cond):
    def reached():
        dep = hub.gpulab("GET", f"/deployments/{name}", token=token).json()
        if dep.get("state") == state and all(dep.get(k) == v for k, v in cond.items()):
            return dep
        return None

    return wait_until(reached, f"{name} {state} {cond}", WAIT_S, 0.5, detail=hub.log_tail)


def triton(hub, user, name):
    return httpclient.InferenceServerClient(
        f"127.0.0.1:{hub.port}/services/gpulab/endpoints/{user}/{name}"
    )


def infer(hub, user, name, x, token=None):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)  # binary-data extension: tritonclient's default
    headers = {"Authorization": f"token {token}"} if token else None
    return triton(hub, user, name).infer(name, [inp], headers=headers).as_numpy("output")


def test_tritonclient_calls_the_endpoint_through_the_hub(hub, tokens, model_dir):
    path, model = model_dir
    alice = client(hub, tokens["alice"])
    dep = alice.create_deployment(
        path,
        {"name": "tiny", "replicas": 2, "gpu_milli": 250, "max_batch_size": 8, "max_latency_ms": 2},
    )
    assert dep["state"] == "starting" and dep["path"] == "/services/gpulab/endpoints/alice/tiny"
    dep = wait_state(hub, tokens["alice"], "tiny", replicas_ready=2)
    assert dep["model"]["name"] == "tiny"  # the card is named after the deployment
    assert len(replica_pids(hub, dep["id"])) == 2

    # Each replica holds its own 1/4 slice, placed by the ledger like servers and jobs.
    rows = hub.gpulab("GET", "/allocations", token=tokens["alice"]).json()
    assert sorted((r["owner_kind"], r["owner"], r["milli"]) for r in rows) == [
        ("deployment", f"{dep['id']}/0", 250),
        ("deployment", f"{dep['id']}/1", 250),
    ]

    # Same outputs as the model in the notebook, over the binary extension.
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()
    for _ in range(4):  # both replicas answer (round robin)
        np.testing.assert_allclose(
            infer(hub, "alice", "tiny", x, tokens["alice"]), expected, rtol=1e-5, atol=1e-6
        )
    # And over plain JSON.
    url = f"{hub.url}{dep['path']}/v2/models/tiny/infer"
    r = requests.post(
        url,
        headers=hub.auth(tokens["alice"]),
        timeout=60,
        json={
            "inputs": [
                {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x[0].tolist()}
            ]
        },
    )
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["outputs"][0]["data"], expected[0], rtol=1e-5, atol=1e-6)

    # Without a token: 401; with another user's: 403; the admin's: allowed.
    with pytest.raises(InferenceServerException) as info:
        infer(hub, "alice", "tiny", x)
    assert info.value.status() == "401"
    with pytest.raises(InferenceServerException) as info:
        infer(hub, "alice", "tiny", x, tokens["bob"])
    assert info.value.status() == "403" and "not shared with you" in info.value.message()
    assert requests.post(url, timeout=60, json={}).status_code == 401
    np.testing.assert_allclose(
        infer(hub, "alice", "tiny", x, hub.admin_token), expected, rtol=1e-5, atol=1e-6
    )
    # The replicas themselves refuse callers without their secret, even root here (only
    # the service's account reaches their sockets: tests/security/test_replica_network.py).
    import json

    from support.unix_http import unix_request

    record = json.loads((hub.data_dir / "deployments" / dep["id"] / "replica0.json").read_text())
    status, body = unix_request(
        record["socket"], "POST", "/v2/models/tiny/infer", hub.auth(tokens["alice"]), {}
    )
    assert status == 401 and "endpoint URL" in body["error"]
    # Bob sees none of it through the API either.
    assert hub.gpulab("GET", "/deployments", token=tokens["bob"]).json() == []
    r = hub.gpulab("GET", "/deployments/tiny", token=tokens["bob"], params={"user": "alice"})
    assert r.status_code == 404
    r = hub.gpulab("DELETE", "/deployments/tiny", token=tokens["bob"], params={"user": "alice"})
    assert r.status_code == 404

    # Alice shares it with bob (not carol).
    r = hub.gpulab(
        "PATCH", "/deployments/tiny", token=tokens["alice"], json={"share_users": ["bob"]}
    )
    assert r.status_code == 200 and r.json()["share_users"] == ["bob"]
    np.testing.assert_allclose(
        infer(hub, "alice", "tiny", x, tokens["bob"]), expected, rtol=1e-5, atol=1e-6
    )
    with pytest.raises(InferenceServerException) as info:
        infer(hub, "alice", "tiny", x, tokens["carol"])
    assert info.value.status() == "403"

    # Bad requests through the hub: 400 with a message, and the endpoint keeps serving.
    bad = [
        (
            {"inputs": [{"name": "input", "shape": [1, 5], "datatype": "FP32", "data": [0.0] * 5}]},
            "shape",
        ),
        (
            {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "INT64", "data": [0] * 4}]},
            "datatype",
        ),
    ]
    for body, word in bad:
        r = requests.post(url, headers=hub.auth(tokens["alice"]), json=body, timeout=60)
        assert r.status_code == 400 and word in r.json()["error"], r.text
    r = requests.post(url, headers=hub.auth(tokens["alice"]), data=b"{nope", timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = requests.post(
        url.replace("/models/tiny/", "/models/other/"),
        headers=hub.auth(tokens["alice"]),
        json=bad[0][0],
        timeout=60,
    )
    assert r.status_code == 400 and "unknown model 'other'" in r.json()["error"]
    np.testing.assert_allclose(
        infer(hub, "alice", "tiny", x, tokens["alice"]), expected, rtol=1e-5, atol=1e-6
    )

    # The listing shows traffic: requests/s and p99 from the replicas' metrics.
    def traffic():
        [listed] = alice.list_deployments()
        return listed if listed["requests_total"] >= 10 else None

    listed = wait_until(traffic, "10 requests in the listing", 60, 1)
    assert listed["replicas_ready"] == 2

    # Stop: replicas gone, slices released, the endpoint no longer there.
    stopped = alice.stop_deployment("tiny")
    assert stopped["state"] == "stopped"
    assert replica_pids(hub, dep["id"]) == []
    assert hub.gpulab("GET", "/allocations", token=tokens["alice"]).json() == []
    assert (
        requests.post(
            url, headers=hub.auth(tokens["alice"]), json=bad[0][0], timeout=60
        ).status_code
        == 404
    )
    assert not (hub.data_dir / "deployments" / dep["id"]).exists()


def test_a_dead_replica_is_restarted_and_replicas_survive_a_service_restart(hub, tokens, model_dir):
    path, model = model_dir
    alice = client(hub, tokens["alice"])
    alice.create_deployment(path, {"name": "phoenix", "gpu_milli": 100})
    dep = wait_state(hub, tokens["alice"], "phoenix")
    [pid] = replica_pids(hub, dep["id"])
    x = np.ones((2, 4), np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()

    os.kill(pid, signal.SIGKILL)
    dep = wait_state(hub, tokens["alice"], "phoenix", restarts=1, replicas_ready=1)
    [new_pid] = replica_pids(hub, dep["id"])
    assert new_pid != pid and "1 restart so far" in dep["message"]
    np.testing.assert_allclose(
        infer(hub, "alice", "phoenix", x, tokens["alice"]), expected, rtol=1e-5, atol=1e-6
    )

    # The service dies (kill -9); the hub starts it again; it finds the replica.
    old = hub.service_pid()
    os.kill(old, signal.SIGKILL)
    hub.wait_service_restarted(old)
    dep = wait_state(hub, tokens["alice"], "phoenix", replicas_ready=1)
    assert replica_pids(hub, dep["id"]) == [new_pid]  # adopted, not started again
    np.testing.assert_allclose(
        infer(hub, "alice", "phoenix", x, tokens["alice"]), expected, rtol=1e-5, atol=1e-6
    )
    [row] = hub.gpulab("GET", "/allocations", token=tokens["alice"]).json()
    assert (row["owner_kind"], row["milli"]) == ("deployment", 100)
    alice.stop_deployment("phoenix")


def test_bad_deployments_are_refused_and_leave_nothing(hub, tokens, model_dir):
    path, _ = model_dir
    carol = client(hub, tokens["carol"])
    cases = [
        ({"name": "Bad Name"}, 400, "'name' must be"),
        ({"name": "ok", "replicas": 0}, 400, "'replicas' must be an integer from 1"),
        ({"name": "ok", "gpu_milli": 333}, 400, "333"),
        ({"name": "ok", "max_batch_size": 64}, 400, "above the 8 rows"),
        ({"name": "ok", "colour": "red"}, 400, "unknown field: colour"),
        ({"name": "ok", "share_users": "bob"}, 400, "'share_users' must be a list"),
        # 3 whole GPUs on a cluster of 2: all or nothing.
        ({"name": "big", "gpu_milli": 1000, "replicas": 3}, 409, "no GPU has room"),
    ]
    for settings, status, message in cases:
        with pytest.raises(GpuLabError) as info:
            carol.create_deployment(path, settings)
        assert info.value.status == status and message in str(info.value), settings
    r = hub.gpulab(
        "POST", "/deployments", token=tokens["carol"], files={"spec": (None, '{"name": "x"}')}
    )
    assert r.status_code == 400 and "'model' file" in r.json()["error"]
    r = hub.gpulab(
        "POST",
        "/deployments",
        token=tokens["carol"],
        files={"spec": (None, '{"name": "x"}'), "model": ("m.tar", b"not a tar")},
    )
    assert r.status_code == 400 and "not a readable tar" in r.json()["error"]

    carol.create_deployment(path, {"name": "once"})
    with pytest.raises(GpuLabError) as info:
        carol.create_deployment(path, {"name": "once"})
    assert info.value.status == 409 and "already have a deployment 'once'" in str(info.value)
    carol.stop_deployment("once")
    assert hub.gpulab("GET", "/deployments", token=tokens["carol"]).json() == []
    assert hub.gpulab("GET", "/allocations", token=tokens["carol"]).json() == []
    left = [
        d
        for d in os.listdir(hub.data_dir / "deployments")
        if not any(x["id"] == d for x in hub.gpulab("GET", "/deployments").json())
    ]
    assert left == []


def test_deployment_stops_with_its_owners_server_when_asked(hub, tokens, model_dir):
    path, _ = model_dir
    token = hub.create_user("dave")
    assert hub.spawn("dave", {"gpu_milli": 0}).status_code in (201, 202)
    hub.wait_server("dave")
    dave = client(hub, token)
    dave.create_deployment(path, {"name": "follows", "stop_with_server": True, "gpu_milli": 100})
    dave.create_deployment(path, {"name": "stays", "gpu_milli": 100})
    followed = wait_state(hub, token, "follows")

    assert hub.hub_api("DELETE", "/users/dave/server").status_code in (202, 204)
    hub.wait_server("dave", ready=False)
    wait_until(
        lambda: [d["name"] for d in dave.list_deployments()] == ["stays"],
        "only the deployment that does not follow the server to be left",
        WAIT_S,
        every=0.5,
        detail=lambda: str(dave.list_deployments()),
    )
    assert replica_pids(hub, followed["id"]) == []
    rows = hub.gpulab("GET", "/allocations", token=token).json()
    assert [r["owner"].split("/")[0] for r in rows] == [dave.get_deployment("stays")["id"]]
    dave.stop_deployment("stays")


def test_deployments_are_in_the_openapi_document(hub):
    doc = hub.gpulab("GET", "/openapi.json").json()
    paths = doc["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/deployments"])
    assert {"get", "patch", "delete"} <= set(paths["/api/v1/deployments/{name}"])
    assert "multipart/form-data" in paths["/api/v1/deployments"]["post"]["requestBody"]["content"]
    assert "p99_latency_ms" in doc["components"]["schemas"]["Deployment"]["properties"]


def test_a_replica_that_keeps_crashing_fails_the_deployment_and_frees_its_slice(
    hub, tokens, model_dir, tmp_path
):
    """A model file the server cannot load: the replica exits at start, is restarted, and
    after MAX_CRASHES the deployment fails with the log's last lines and gives its slice back."""
    import shutil

    from gpulab.backend.local_serving import MAX_CRASHES

    path, _ = model_dir
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "model.pt2").write_bytes(b"not an exported program")
    bob = client(hub, tokens["bob"])
    bob.create_deployment(str(broken), {"name": "crashy", "gpu_milli": 100})
    dep = wait_state(hub, tokens["bob"], "crashy", state="failed")
    assert dep["restarts"] == MAX_CRASHES - 1
    assert f"exited with code 1 ({MAX_CRASHES} times" in dep["message"]
    # The server's own error, from its log.
    assert "gpulab-serving: cannot load the model" in dep["message"], dep["message"]
    # The replica's log, through the backend (a file here, the pod's log on Kubernetes).
    logs = hub.gpulab("GET", "/deployments/crashy/logs", token=tokens["bob"])
    assert logs.status_code == 200 and logs.headers["Content-Type"].startswith("text/plain")
    assert "[gpulab] starting replica 0" in logs.text
    assert "gpulab-serving: cannot load the model" in logs.text
    assert (
        hub.gpulab(
            "GET", "/deployments/crashy/logs", token=tokens["bob"], params={"replica": "1"}
        ).status_code
        == 400
    )
    assert hub.gpulab("GET", "/allocations", token=tokens["bob"]).json() == []
    assert replica_pids(hub, dep["id"]) == []
    # A failed deployment stays listed (with its reason) until it is stopped.
    assert [d["state"] for d in bob.list_deployments()] == ["failed"]
    bob.stop_deployment("crashy")
    assert bob.list_deployments() == []
