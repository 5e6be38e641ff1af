"""``%deploy`` endpoints on Kubernetes, through the real service: a real hub whose
gpulab service has ``c.GpuLabService.kubernetes_deployments`` set and talks to a
fake Kubernetes API server (the only fake here: no API server runs on this
machine). The ledger places the slice, the service sends the endpoint's Secret,
Deployment and Service, follows the Deployment's ready replicas, and deletes
all of it (and releases the slice) on stop.
"""

import asyncio
import base64
import threading

import pytest
import torch
from fake_apiserver import FakeApiServer
from hubproc import RunningHub
from support.wait import wait_until

from gpulab.client import Client
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow
NS = "ml"
WAIT_S = 120  # a bound, not a sleep


@pytest.fixture(scope="module")
def api():
    """The fake API server on an event loop of its own (the hub's service calls it)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(FakeApiServer().start(), loop).result(30)
    yield server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, api):
    data = tmp_path_factory.mktemp("kubedeployhub")
    kubeconfig = api.kubeconfig(data / "kubeconfig")
    config = (
        f"c.GpuLabService.kubernetes_deployments = {{'namespace': {NS!r}, "
        f"'models_pvc': 'gpulab-models', 'image': 'registry.example/gpulab:1', "
        f"'enforcement': 'hami', 'kubeconfig': {kubeconfig!r}}}\n"
    )
    h = RunningHub(data, simulate="2xA100-80GB", config=config)
    yield h
    h.stop()


def wait(predicate, what):
    return wait_until(predicate, what, WAIT_S)


def test_an_endpoint_becomes_kubernetes_objects_and_goes_away_on_stop(hub, api, tmp_path):
    token = hub.create_user("kate")
    model_dir = tmp_path / "model"
    export_model(torch.nn.Linear(4, 2).eval(), torch.randn(2, 4), str(model_dir), max_batch_size=8)
    kate = Client(hub.api, token=token)
    dep = kate.create_deployment(str(model_dir), {"name": "lin", "replicas": 2, "gpu_milli": 250})
    name = f"gpulab-ep-d{dep['id']}"
    deployment = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments", name)
    assert deployment and deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert str(limits["nvidia.com/gpu"]) == "1" and "nvidia.com/gpumem" in limits  # hami, 1/4
    secret = api.get(f"/api/v1/namespaces/{NS}/secrets", f"{name}-token")
    token_file = hub.data_dir / "deployments" / dep["id"] / "token"
    assert base64.b64decode(secret["data"]["token"]).decode() == token_file.read_text().strip()
    assert api.get(f"/api/v1/namespaces/{NS}/services", name)
    # The model went to the claim's directory the pods mount (only theirs).
    assert (hub.data_dir / "deployments" / dep["id"] / "model" / "model.pt2").exists()
    rows = hub.gpulab("GET", "/allocations", token=token).json()
    assert sorted((r["owner_kind"], r["milli"]) for r in rows) == [("deployment", 250)] * 2

    assert kate.get_deployment("lin")["state"] == "starting"
    api.set_status(f"/apis/apps/v1/namespaces/{NS}/deployments", name, {"readyReplicas": 2})
    dep = wait(
        lambda: (d := kate.get_deployment("lin"))["state"] == "running" and d,
        "the deployment to be running",
    )
    # Traffic is counted at the service's router, on Kubernetes too: none yet.
    assert dep["replicas_ready"] == 2 and dep["requests_total"] == 0
    assert dep["versions"][0]["replicas"] == 2

    kate.stop_deployment("lin")
    for collection in (
        f"/apis/apps/v1/namespaces/{NS}/deployments",
        f"/api/v1/namespaces/{NS}/services",
        f"/api/v1/namespaces/{NS}/secrets",
    ):
        assert api.get(collection, name) is None and api.get(collection, f"{name}-token") is None
    assert hub.gpulab("GET", "/allocations", token=token).json() == []
    assert kate.list_deployments() == []
