"""Endpoints that scale and roll out, end to end: a real hub and proxy, the gpulab
service and its endpoint router, real model-server replicas, ``tritonclient.http``.

Only the GPUs are declared (``--simulate-gpus``): slices are placed and accounted
for by the ledger, the replicas run on CPU.
"""

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import torch
import tritonclient.http as httpclient
from hubproc import fresh_user
from support.wait import wait_until
from tritonclient.utils import InferenceServerException

from gpulab.client import Client, Endpoint
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 10
BODY = {
    "inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}]
}


def linear_model(tmp_path: Path, name: str, seed: int):
    """A 4 -> 3 model and its export; different seeds answer differently."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3).eval()
    path = tmp_path / name
    export_model(model, torch.randn(2, 4), str(path), name="ignored", max_batch_size=8)
    return str(path), model(torch.from_numpy(X)).detach().numpy()


@pytest.fixture(scope="module")
def users(hub):
    names = {k: fresh_user(k) for k in ("ada", "bea", "cy")}
    return {k: (n, hub.create_user(n)) for k, n in names.items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    return {k: linear_model(tmp, k, seed) for k, seed in (("a", 1), ("b", 2), ("c", 3))}


def get(hub, token, name):
    return hub.gpulab("GET", f"/deployments/{name}", token=token).json()


def wait_for(hub, token, name, what, check):
    return wait_until(
        lambda: (d := get(hub, token, name)) and check(d) and d,
        f"{name}: {what}",
        timeout=WAIT_S,
        detail=lambda: f"{get(hub, token, name)}\n{hub.log_tail(3000)}",
    )


def slices(hub, token, owner_prefix=""):
    rows = hub.gpulab("GET", "/allocations", token=token).json()
    return sorted(r["owner"] for r in rows if r["owner"].startswith(owner_prefix))


def infer_json(hub, dep, token, path_extra="", x=X):
    url = f"{hub.url}{dep['path']}/v2/models/{dep['name']}{path_extra}/infer"
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32"}]}
    body["inputs"][0]["data"] = x.reshape(-1).tolist()
    return requests.post(url, json=body, headers=hub.auth(token), timeout=120)


def outputs(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def which(answer: np.ndarray, expected: dict) -> str:
    """The model (key of ``expected``) that gave ``answer``."""
    [key] = [k for k, v in expected.items() if np.allclose(answer, v, atol=1e-5)]
    return key


def test_calls_go_through_the_endpoint_router_behind_the_proxy(hub, users):
    """The proxy routes <prefix>endpoints to the router, not to the service's port."""
    pid = int((hub.data_dir / "jupyterhub-proxy.pid").read_text())
    cmd = psutil.Process(pid).cmdline()
    api_port = cmd[cmd.index("--api-port") + 1]
    token = (hub.data_dir / "proxy-token").read_text().strip()
    routes = requests.get(
        f"http://127.0.0.1:{api_port}/api/routes",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    ).json()
    router = routes["/services/gpulab/endpoints"]["target"]
    assert router != routes["/services/gpulab"]["target"]
    # The router answers for itself: bad credentials and bad paths get short errors.
    name, tok = users["ada"]
    base = f"{hub.url}/services/gpulab/endpoints"
    r = requests.post(f"{base}/{name}/x/v2/models/x/infer", headers=hub.auth("nope"), timeout=30)
    assert r.status_code == 401 and "token" in r.json()["error"]
    # A name that is not UTF-8 (the proxy itself answers 500 "URI malformed" to
    # that; the router, asked directly, says what is wrong).
    r = requests.post(
        f"{router}/services/gpulab/endpoints/%ff/x/v2/models/x/infer",
        headers=hub.auth(tok),
        timeout=30,
    )
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]
    r = requests.put(f"{base}/{name}/x/v2/models/x/infer", headers=hub.auth(tok), timeout=30)
    assert r.status_code == 405
    r = requests.post(f"{base}/{name}/none/v2/models/none/infer", headers=hub.auth(tok), timeout=30)
    assert r.status_code == 404 and "no deployment 'none'" in r.json()["error"]
    # No token: the service's own route answers (a browser's cookie would do there).
    assert requests.post(f"{base}/{name}/x/v2/models/x/infer", timeout=30).status_code == 401


def test_grows_under_load_and_shrinks_after_the_delay(hub, users, models):
    name, token = users["ada"]
    path, expected = models["a"]
    ada = Client(hub.api, token=token)
    dep = ada.create_deployment(
        path,
        {
            "name": "elastic",
            "min_replicas": 1,
            "max_replicas": 3,
            "target_inflight": 2,
            "scale_down_delay_s": 4,
            "gpu_milli": 100,
            "max_batch_size": 8,
            "max_latency_ms": 50,  # calls linger in the batcher: each client holds one
        },
    )
    try:
        assert (dep["min_replicas"], dep["max_replicas"], dep["replicas"]) == (1, 3, 1)
        dep = wait_for(hub, token, "elastic", "running", lambda d: d["state"] == "running")
        stop, answers = threading.Event(), Counter()

        def client():
            with requests.Session() as s:
                while not stop.is_set():
                    r = s.post(
                        f"{hub.url}{dep['path']}/v2/models/elastic/infer",
                        json={
                            "inputs": [
                                {
                                    "name": "input",
                                    "shape": [2, 4],
                                    "datatype": "FP32",
                                    "data": X.reshape(-1).tolist(),
                                }
                            ]
                        },
                        headers=hub.auth(token),
                        timeout=120,
                    )
                    ok = r.status_code == 200 and np.allclose(outputs(r), expected, atol=1e-5)
                    answers["ok" if ok else f"{r.status_code} {r.text[:200]}"] += 1

        threads = [threading.Thread(target=client) for _ in range(12)]
        for t in threads:
            t.start()
        try:
            grown = wait_for(
                hub,
                token,
                "elastic",
                "3 replicas ready under load",
                lambda d: d["replicas"] == 3 and d["replicas_ready"] == 3,
            )
            # Each replica holds a slice of its own.
            assert len(slices(hub, token, grown["id"])) == 3
            # The calls it holds (a snapshot may fall between two calls of every client).
            wait_for(
                hub, token, "elastic", "calls in flight", lambda d: d["versions"][0]["inflight"]
            )
            # The metric a HorizontalPodAutoscaler or KEDA would read (ids, no user names).
            text = requests.get(
                f"{hub.url}/services/gpulab/metrics", headers=hub.auth(token), timeout=30
            ).text
            series = [
                line
                for line in text.splitlines()
                if line.startswith("gpulab_endpoint_inflight_requests{")
                and f'deployment="{grown["id"]}"' in line
            ]
            assert len(series) == 1 and float(series[0].rsplit(" ", 1)[1]) >= 0
            assert name not in text
        finally:
            stop.set()
            for t in threads:
                t.join()
        shrunk = wait_for(
            hub, token, "elastic", "back to 1 replica after the delay", lambda d: d["replicas"] == 1
        )
        # The replicas scaled away give their slices back once they have exited (they may
        # take their grace period): held until then, as any running replica's.
        wait_until(
            lambda: slices(hub, token, shrunk["id"]) == [f"{shrunk['id']}/0"],
            "the slices of the replicas scaled away given back",
            timeout=WAIT_S,
            detail=lambda: f"{slices(hub, token, shrunk['id'])}\n{hub.log_tail(3000)}",
        )
        # Nothing was lost while replicas came and went (calls drain before a replica stops).
        assert set(answers) == {"ok"} and answers["ok"] > 50, answers
    finally:  # the next tests list ada's endpoints
        ada.stop_deployment("elastic")


def test_scales_to_zero_and_a_cold_call_succeeds(hub, users, models):
    name, token = users["ada"]
    path, expected = models["a"]
    ada = Client(hub.api, token=token)
    dep = ada.create_deployment(
        path,
        {
            "name": "sleepy",
            "min_replicas": 0,
            "max_replicas": 1,
            # Long enough that the replica a cold call starts is still there when the
            # test counts its slice, two calls later on a loaded machine.
            "scale_down_delay_s": 10,
            "gpu_milli": 250,
        },
    )
    assert dep["replicas"] == 1  # one replica at first: the model is known to load
    idle = wait_for(
        hub,
        token,
        "sleepy",
        "scaled to zero",
        lambda d: d["state"] == "idle" and d["replicas"] == 0,
    )
    assert slices(hub, token, dep["id"]) == []  # every slice back
    assert "next call starts a replica" in idle["message"]
    assert "idle" in ada_list_text(ada)
    # A cold call waits for its replica instead of failing, with tritonclient too.
    client = httpclient.InferenceServerClient(hub.url.split("://", 1)[1] + dep["path"])
    inp = httpclient.InferInput("input", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    result = client.infer("sleepy", [inp], headers={"Authorization": f"token {token}"}, timeout=240)
    np.testing.assert_allclose(result.as_numpy("output"), expected, atol=1e-5)
    warm = get(hub, token, "sleepy")
    (v,) = warm["versions"]
    assert v["cold_starts"] == 1 and v["last_cold_start_s"] > 0
    assert len(slices(hub, token, dep["id"])) == 1
    ada.stop_deployment("sleepy")


def ada_list_text(client) -> str:
    from gpulab.magics.deploy import list_table

    return list_table(client.list_deployments())


def test_canary_split_promote_and_rollback(hub, users, models):
    name, token = users["bea"]
    bea = Client(hub.api, token=token)
    expected = {k: v[1] for k, v in models.items()}
    dep = bea.create_deployment(
        models["a"][0], {"name": "split", "replicas": 1, "gpu_milli": 100, "max_latency_ms": 1}
    )
    wait_for(hub, token, "split", "running", lambda d: d["state"] == "running")
    dep = bea.create_deployment(models["b"][0], {"name": "split", "canary": 20})
    assert [v["weight"] for v in dep["versions"]] == [80, 20]
    dep = wait_for(
        hub, token, "split", "the canary running", lambda d: d["versions"][1]["state"] == "running"
    )
    # 200 calls: 20% to the canary, within 10 points.
    got = Counter(which(outputs(infer_json(hub, dep, token)), expected) for _ in range(200))
    assert set(got) == {"a", "b"} and 20 <= got["b"] <= 60, got
    listed = get(hub, token, "split")
    assert [v["requests_total"] for v in listed["versions"]] == [got["a"], got["b"]]
    assert listed["replicas"] == listed["replicas_ready"] == 2  # total over versions
    assert all(v["errors_total"] == 0 and v["p99_latency_ms"] for v in listed["versions"])
    text = ada_list_text(bea)
    assert "v1" in text and "80% of calls" in text and "20% of calls" in text

    # tritonclient reaches each version by its number.
    client = httpclient.InferenceServerClient(hub.url.split("://", 1)[1] + dep["path"])
    inp = httpclient.InferInput("input", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    auth = {"Authorization": f"token {token}"}
    for version, key in (("1", "a"), ("2", "b")):
        out = client.infer("split", [inp], model_version=version, headers=auth).as_numpy("output")
        assert which(out, expected) == key
    with pytest.raises(InferenceServerException) as info:
        client.infer("split", [inp], model_version="7", headers=auth)
    assert info.value.status() == "404" and "no version 7" in info.value.message()

    # One canary at a time; a canary of nothing is refused.
    from gpulab.client import GpuLabError

    with pytest.raises(GpuLabError) as err:
        bea.create_deployment(models["c"][0], {"name": "split", "canary": 10})
    assert err.value.status == 409 and "already has a canary" in str(err.value)
    with pytest.raises(GpuLabError) as err:
        bea.create_deployment(models["c"][0], {"name": "nothing", "canary": 10})
    assert err.value.status == 404 and "deploy it first" in str(err.value)

    # Promote: every call to version 2, version 1 gone with its slice.
    v1_id = dep["id"]
    promoted = bea.promote_deployment("split")
    assert [(v["version"], v["weight"]) for v in promoted["versions"]] == [(2, 100)]
    assert {which(outputs(infer_json(hub, dep, token)), expected) for _ in range(20)} == {"b"}
    assert not [o for o in slices(hub, token) if o.startswith(f"{v1_id}/")]
    assert not (hub.data_dir / "deployments" / v1_id).exists()
    with pytest.raises(GpuLabError) as err:
        bea.promote_deployment("split")
    assert err.value.status == 409 and "no canary" in str(err.value)

    # A third model as a canary at 50%, rolled back: version 2 takes every call again.
    bea.create_deployment(models["c"][0], {"name": "split", "canary": 50})
    wait_for(
        hub, token, "split", "canary 3 running", lambda d: d["versions"][-1]["state"] == "running"
    )
    assert {which(outputs(infer_json(hub, dep, token)), expected) for _ in range(20)} == {"b", "c"}
    rolled = bea.rollback_deployment("split")
    assert [(v["version"], v["weight"]) for v in rolled["versions"]] == [(2, 100)]
    assert "rolled back by its owner" in rolled["versions"][0]["message"]
    assert {which(outputs(infer_json(hub, dep, token)), expected) for _ in range(20)} == {"b"}
    bea.stop_deployment("split")
    assert slices(hub, token) == []


def test_catalog_and_endpoint_object_follow_the_sharing_rules(hub, users, models):
    (ada, ada_token), (bea, bea_token) = users["ada"], users["bea"]
    cy, cy_token = users["cy"]
    path, expected = models["a"]
    owner = Client(hub.api, token=ada_token)
    dep = owner.create_deployment(path, {"name": "shared", "replicas": 1, "max_latency_ms": 1})
    wait_for(hub, ada_token, "shared", "running", lambda d: d["state"] == "running")
    assert [m["endpoint"] for m in owner.models()] == [f"{ada}/shared"]
    bea_client = Client(hub.api, token=bea_token)
    assert bea_client.models() == []
    with pytest.raises(Exception, match="no endpoint is called"):
        Endpoint(f"{ada}/shared", client=bea_client)
    # Not shared: 403 on every version path, and the caller's token never helps.
    r = infer_json(hub, dep, bea_token, "/versions/1")
    assert r.status_code == 403 and "not shared with you" in r.json()["error"]

    owner.share_deployment("shared", share_users=[bea])
    [listed] = bea_client.models()
    assert listed["owner"] == ada and listed["shared"] is True
    assert listed["inputs"][0]["name"] == "input" and listed["versions"][0]["weight"] == 100
    ep = Endpoint(f"{ada}/shared", client=bea_client)
    np.testing.assert_allclose(ep.infer(X)["output"], expected, atol=1e-5)
    np.testing.assert_allclose(ep.infer({"input": X}, version=1)["output"], expected, atol=1e-5)
    with pytest.raises(ValueError, match="takes 1 input"):
        ep.infer((X, X))
    # Someone it is not shared with still gets 403; the admin may call it.
    assert infer_json(hub, dep, cy_token).status_code == 403
    assert infer_json(hub, dep, hub.admin_token).status_code == 200
    # Bad settings are refused with what to do.
    r = requests.post(
        f"{hub.api}/deployments",
        headers=hub.auth(cy_token),
        files={
            "spec": (None, '{"name": "bad", "min_replicas": 3, "max_replicas": 1}'),
            "model": ("m.tar.gz", b"x"),
        },
        timeout=60,
    )
    assert r.status_code == 400 and "below 'min_replicas'" in r.json()["error"]
    owner.stop_deployment("shared")
