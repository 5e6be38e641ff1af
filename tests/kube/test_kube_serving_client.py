"""KubernetesServing against a fake API server: what it sends, and what it makes of the answers.

Only the Kubernetes API server is faked (``fake_apiserver``: real HTTP, the
real ``kubernetes_asyncio`` client); the Deployment and Service are the real
builder's output, the slice comes from the real enforcement backend (HAMi,
a quarter of an 80 GiB card), and every object sent is validated against the
Kubernetes schemas (``kubernetes-validate --strict``). The Deployment's
``readyReplicas`` is set by the test, standing in for the Deployment controller,
and the pods and their logs (``PodsApiServer``) stand in for the kubelet. A
Kubernetes API server cannot run on this machine; ``tests/kube/test_live_cluster.py``
runs against a real one when ``GPULAB_TEST_KUBECONFIG`` is set.
"""

import base64
import os
import stat
import subprocess
import sys

import pytest
from aiohttp import web
from fake_apiserver import FakeApiServer
from kube_helpers import endpoint_unit, serving_on, validate_strict
from support.plugin_host import kubernetes_serving

from gpulab.backend.kubernetes.deploy import TOKEN_ENV, make_deployment
from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.backend.serving_base import ServingBackend
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, pod_slice_patch
from gpulab.service.plugins import ConfigError

NS = "gpulab"
SECRETS = "/api/v1/namespaces/gpulab/secrets"
DEPLOYMENTS = "/apis/apps/v1/namespaces/gpulab/deployments"
SERVICES = "/api/v1/namespaces/gpulab/services"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/gpulab/networkpolicies"
IMAGE = "registry.example/gpulab:1"
PVC = "gpulab-models"
# Deployment ids are 12 hex characters and may start with a digit.
DEP = endpoint_unit(id="0a1b2c3d4e5f", replicas=2)
PODS = "/api/v1/namespaces/gpulab/pods"
NAME = "gpulab-ep-d0a1b2c3d4e5f"
ROWS = [{"owner": f"{DEP['id']}/{r}", "gpu_uuid": f"GPU-{r}", "milli": 250} for r in range(2)]


class PodsApiServer(FakeApiServer):
    """Also lists pods by label and serves their logs, as the kubelet would through the API."""

    def __init__(self):
        super().__init__()
        self.logs: dict[str, str] = {}  # pod name -> its log

    def add_pod(self, name: str, labels: dict, log: str | None = None) -> None:
        self.objects[f"{PODS}/{name}"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
        }
        if log is not None:
            self.logs[name] = log

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        if request.method == "GET" and path == PODS:
            self.requests.append(("GET", f"{path}?{request.query_string}", None))
            key, _, value = request.query.get("labelSelector", "").partition("=")
            items = [
                o
                for k, o in self.objects.items()
                if k.startswith(PODS + "/") and o["metadata"]["labels"].get(key) == value
            ]
            return web.json_response(
                {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            )
        if request.method == "GET" and path.startswith(PODS + "/") and path.endswith("/log"):
            name = path[len(PODS) + 1 : -len("/log")]
            self.requests.append(("GET", f"{path}?{request.query_string}", None))
            if name not in self.logs:
                return web.json_response(
                    {
                        "kind": "Status",
                        "code": 400,
                        "message": f"container server in pod {name} is waiting to "
                        f"start: ContainerCreating",
                    },
                    status=400,
                )
            lines = self.logs[name].splitlines(keepends=True)
            tail = int(request.query.get("tailLines", len(lines)))
            return web.Response(text="".join(lines[-tail:]))
        return await super()._objects(request)


def quarter_for(dep, rows):
    patch = pod_slice_patch("hami", GpuSlice.of(dep["gpu_milli"], 81920))
    return lambda template: apply_to_pod(template, patch)


@pytest.fixture
async def cluster(tmp_path):
    server = await PodsApiServer().start()
    serving = serving_on(
        server, tmp_path, pod_patch_for=quarter_for, priority_class="gpulab-serving"
    )
    serving.prepare(DEP["id"])
    yield server, serving
    await serving.close()
    await server.stop()


def posts(server):
    return [(path, body) for method, path, body in server.requests if method == "POST"]


async def test_launch_sends_secret_deployment_service_in_order(cluster):
    server, serving = cluster
    await serving.launch(DEP, ROWS)
    sent = posts(server)
    assert [(path, body["kind"], body["metadata"]["name"]) for path, body in sent] == [
        (SECRETS, "Secret", f"{NAME}-token"),
        (POLICIES, "NetworkPolicy", NAME),
        (DEPLOYMENTS, "Deployment", NAME),
        (SERVICES, "Service", NAME),
    ]
    for _, body in sent:
        validate_strict(body)
        assert "namespace" not in body["metadata"] or body["metadata"]["namespace"] == NS

    secret, policy, deployment, service = (body for _, body in sent)
    # Calls to the replicas only from the service's (the router's) pods; out to DNS only.
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"gpulab.io/endpoint": "d0a1b2c3d4e5f"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {
                        "podSelector": {
                            "matchLabels": {
                                "app.kubernetes.io/name": "gpulab",
                                "app.kubernetes.io/component": "service",
                            }
                        }
                    }
                ],
                "ports": [{"protocol": "TCP", "port": 8080}],
            }
        ],
        "egress": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}],
    }
    assert base64.b64decode(secret["data"]["token"]).decode() == serving.token(DEP["id"])
    assert secret["metadata"]["annotations"]["gpulab.io/user"] == "ann"

    # Exactly the builder's objects, with the slice patch and this deployment's files.
    expected = make_deployment(
        "d0a1b2c3d4e5f",
        image=IMAGE,
        model_dir=serving.model_dir(DEP["id"]),
        models_pvc=PVC,
        models_root=serving.root,
        user="ann",
        replicas=2,
        max_batch_size=16,
        max_latency_ms=4.0,
        max_queue=128,
        token_secret=f"{NAME}-token",
        priority_class="gpulab-serving",
        pod_patch=quarter_for(DEP, ROWS),
    )
    assert [deployment, service] == expected

    assert deployment["spec"]["replicas"] == DEP["replicas"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    token_env = next(e for e in container["env"] if e["name"] == TOKEN_ENV)
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": f"{NAME}-token", "key": "token"}
    model_dir = serving.model_dir(DEP["id"])
    assert container["volumeMounts"] == [
        {
            "name": "models",
            "mountPath": model_dir,
            "subPath": f"{DEP['id']}/model",
            "readOnly": True,
        }
    ]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == PVC
    assert serving.model_dir(DEP["id"]) in container["command"]
    # The HAMi quarter slice is in the pod template.
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1 and limits["nvidia.com/gpumem"] == 20480
    assert pod["priorityClassName"] == "gpulab-serving"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert serving.url(DEP) == f"http://{NAME}.{NS}.svc:80"


async def test_a_second_launch_replaces_what_is_there(cluster):
    server, serving = cluster
    await serving.launch(DEP, ROWS)
    server.set_status(DEPLOYMENTS, NAME, {"readyReplicas": 2})
    # A restart of the service, a new token on disk, a launch again: 409s, then replaces.
    serving.prepare(DEP["id"])
    await serving.launch({**DEP, "replicas": 3}, ROWS)
    puts = [(path, body["kind"]) for method, path, body in server.requests if method == "PUT"]
    assert puts == [
        (f"{SECRETS}/{NAME}-token", "Secret"),
        (f"{POLICIES}/{NAME}", "NetworkPolicy"),
        (f"{DEPLOYMENTS}/{NAME}", "Deployment"),
    ]
    stored = server.get(SECRETS, f"{NAME}-token")
    assert base64.b64decode(stored["data"]["token"]).decode() == serving.token(DEP["id"])
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 3
    assert server.get(SERVICES, NAME) is not None  # kept as it was
    assert await serving.ready(DEP) == 2


async def test_ready_reads_ready_replicas(cluster):
    server, serving = cluster
    assert await serving.ready(DEP) == 0  # no Deployment yet
    await serving.launch(DEP, ROWS)
    assert await serving.ready(DEP) == 0  # no status yet
    server.set_status(DEPLOYMENTS, NAME, {"replicas": 2, "updatedReplicas": 2})
    assert await serving.ready(DEP) == 0
    server.set_status(DEPLOYMENTS, NAME, {"replicas": 2, "readyReplicas": 1})
    assert await serving.ready(DEP) == 1
    server.set_status(DEPLOYMENTS, NAME, {"replicas": 2, "readyReplicas": 2})
    assert await serving.ready(DEP) == 2
    # It reads the Deployment itself: the chart's Role grants deployments, not their status.
    assert not any(path.endswith("/status") for _, path, _ in server.requests)


async def test_stop_deletes_all_three_and_is_idempotent(cluster):
    server, serving = cluster
    await serving.launch(DEP, ROWS)
    await serving.stop(DEP)
    deletes = {path: body for method, path, body in server.requests if method == "DELETE"}
    assert deletes[f"{DEPLOYMENTS}/{NAME}"]["propagationPolicy"] == "Foreground"
    assert f"{SERVICES}/{NAME}" in deletes and f"{SECRETS}/{NAME}-token" in deletes
    gone = ((DEPLOYMENTS, NAME), (SERVICES, NAME), (SECRETS, f"{NAME}-token"), (POLICIES, NAME))
    for collection, name in gone:
        assert server.get(collection, name) is None
    assert await serving.ready(DEP) == 0
    await serving.stop(DEP)  # stopping what is gone is fine
    await serving.stop({**DEP, "id": "ffffffffffff"})  # and what never was


async def test_stop_when_only_some_objects_exist(cluster):
    server, serving = cluster
    await serving.launch(DEP, ROWS)
    del server.objects[f"{SERVICES}/{NAME}"]  # deleted outside gpulab
    await serving.stop(DEP)
    assert server.get(DEPLOYMENTS, NAME) is None and server.get(SECRETS, f"{NAME}-token") is None


def test_files_as_local_serving(tmp_path):
    serving = KubernetesServing(str(tmp_path / "d"), namespace=NS, models_pvc=PVC, image=IMAGE)
    model_dir = serving.prepare("abc123abc123")
    assert (
        model_dir
        == serving.model_dir("abc123abc123")
        == os.path.join(serving.root, "abc123abc123", "model")
    )
    assert os.path.isdir(model_dir)
    token_file = serving.path("abc123abc123", "token")
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert len(serving.token("abc123abc123")) >= 32
    assert isinstance(serving, ServingBackend)
    assert serving.restarts_replicas is True and serving.name == "kubernetes"
    serving.remove("abc123abc123")
    assert not os.path.exists(serving.path("abc123abc123"))


def test_no_cluster_client_at_import_or_construction(tmp_path):
    code = (
        "import sys; from gpulab.backend.kubernetes import KubernetesServing; "
        f"KubernetesServing({str(tmp_path / 'd')!r}, namespace='n', models_pvc='p', "
        "image='i'); assert 'kubernetes_asyncio' not in sys.modules, 'imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "KUBECONFIG": "/nonexistent"}
    )


async def test_check_follows_ready_replicas_and_routes_to_the_service(cluster):
    server, serving = cluster
    await serving.adopt(DEP, ROWS)  # after a restart of the service: sent again, idempotent
    health = await serving.check(DEP)
    assert (health.ready, health.state, health.message) == (
        0,
        "starting",
        "0 of 2 replicas ready",
    )
    assert serving.ready_replicas(DEP) == []
    server.set_status(DEPLOYMENTS, NAME, {"readyReplicas": 2})
    health = await serving.check(DEP)
    assert (health.ready, health.state, health.message) == (2, "running", "2 replicas ready")
    # One entry, the Service (numbered 0): it spreads the calls over the replicas.
    assert serving.ready_replicas(DEP) == [(0, f"http://{NAME}.{NS}.svc:80")]
    server.set_status(DEPLOYMENTS, NAME, {"readyReplicas": 1})
    health = await serving.check({**DEP, "state": "running"})
    assert (health.state, health.message) == ("degraded", "1 of 2 replicas ready")
    # Behind a Service the replicas cannot be asked one by one: Prometheus scrapes them.
    assert await serving.stats(DEP) is None
    await serving.stop(DEP)
    assert serving.ready_replicas(DEP) == []


async def test_logs_are_the_pods_logs(cluster):
    """GET /deployments/{name}/logs on Kubernetes: the replica-th pod's log, via the API."""
    server, serving = cluster
    assert await serving.logs(DEP, 0) == ""  # no pods yet
    label = {"gpulab.io/endpoint": "d0a1b2c3d4e5f"}
    server.add_pod(f"{NAME}-7d9f-bbbbb", label, "loading model\nready on :8080\n")
    server.add_pod(f"{NAME}-7d9f-aaaaa", label, '{"json": "line"}\n')
    server.add_pod(f"{NAME}-7d9f-ccccc", label)  # its container has not started
    server.add_pod(
        "gpulab-ep-dffffffffffff-1-xxxxx",
        {"gpulab.io/endpoint": "dffffffffffff"},
        "another endpoint's\n",
    )
    # Pods in name order; the text exactly as the kubelet gave it (JSON lines too).
    assert await serving.logs(DEP, 0) == '{"json": "line"}\n'
    assert await serving.logs(DEP, 1) == "loading model\nready on :8080\n"
    assert (await serving.logs(DEP, 1, max_bytes=6)) == ":8080\n"
    assert await serving.logs(DEP, 2) == ""
    assert await serving.logs(DEP, 3) == ""
    listed = [p for m, p, _ in server.requests if m == "GET" and p.startswith(PODS + "?")]
    assert listed and all("labelSelector=gpulab.io" in p for p in listed)
    reads = [p for m, p, _ in server.requests if p.endswith("/log") or "/log?" in p]
    assert reads and all("container=server" in p and "tailLines=" in p for p in reads)


def test_settings_from_the_dict_of_old(tmp_path):
    root = str(tmp_path / "d")
    serving = kubernetes_serving(
        {
            "namespace": NS,
            "models_pvc": PVC,
            "image": IMAGE,
            "enforcement": "hami",
            "queue": "",
            "port": "9000",
        },
        root,
    )
    assert isinstance(serving, KubernetesServing)
    assert (serving.namespace, serving.models_pvc, serving.port) == (NS, PVC, 9000)
    with pytest.raises(ConfigError, match="unknown key.*bogus.*known: .*namespace"):
        kubernetes_serving({"namespace": NS, "bogus": 1}, root)
    with pytest.raises(ConfigError, match="'port'"):
        kubernetes_serving({"port": "eighty"}, root)
    with pytest.raises(ConfigError, match="needs 'image'"):
        kubernetes_serving({"namespace": NS, "models_pvc": PVC}, root)
    keys = set(KubernetesServing.class_trait_names(config=True))
    assert keys >= {"namespace", "models_pvc", "image", "enforcement", "queue", "port"}


def test_settings_from_config_with_the_dict_on_top(tmp_path):
    from traitlets.config import Config

    c = Config()
    c.KubernetesServingSettings.namespace = "from-config"
    c.KubernetesServingSettings.models_pvc = "pvc-from-config"
    c.KubernetesServingSettings.image = IMAGE
    serving = kubernetes_serving({}, str(tmp_path), config=c)
    assert (serving.namespace, serving.image, serving.port) == ("from-config", IMAGE, 8080)
    serving = kubernetes_serving({"namespace": NS, "models_pvc": PVC}, str(tmp_path), config=c)
    assert (serving.namespace, serving.models_pvc, serving.image) == (NS, PVC, IMAGE)


@pytest.mark.parametrize(
    "extra,priority_class,kueue_class",
    [
        # gpulab's serving class, on the pods and (in a queue) in Kueue.
        ({"priority_class_prefix": "gpulab-"}, "gpulab-serving", "gpulab-serving"),
        # Fixed names win, as before classes existed.
        (
            {"priority_class_prefix": "gpulab-", "priority_class": "ours", "priority": "kq"},
            "ours",
            "kq",
        ),
        ({}, None, None),  # no per-class objects on the cluster: none named
    ],
)
def test_replicas_get_the_serving_class(tmp_path, extra, priority_class, kueue_class):
    serving = kubernetes_serving(
        {"namespace": NS, "models_pvc": PVC, "image": IMAGE, "queue": "gpulab", **extra},
        str(tmp_path),
    )
    serving.prepare(DEP["id"])
    _, _, deployment, _ = serving.objects(DEP, ROWS)
    validate_strict(deployment)
    pod = deployment["spec"]["template"]
    assert pod["spec"].get("priorityClassName") == priority_class
    for obj in (deployment, pod):
        assert obj["metadata"]["labels"].get("kueue.x-k8s.io/priority-class") == kueue_class
        assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpulab"
