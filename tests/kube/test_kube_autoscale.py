"""Endpoint autoscaling on Kubernetes: the HPA and KEDA objects, and what the backend sends.

Only the Kubernetes API server is faked (``fake_apiserver``: real HTTP, the real
``kubernetes_asyncio`` client); the objects are the real builders' output. The
HorizontalPodAutoscaler is validated against the Kubernetes schemas
(``kubernetes-validate --strict``). KEDA's ScaledObject is a custom resource and
no schema for it ships with kubernetes-validate, so its fields are checked
literally, against KEDA's documented spec (https://keda.sh/docs/latest/reference/scaledobject-spec/
and the ``prometheus`` scaler). The test writes the Deployment's ``spec.replicas``
where an HPA would (no controllers run here). A Kubernetes API server cannot run on
this machine; ``tests/kube/test_live_cluster.py`` runs against a real one when
``GPULAB_TEST_KUBECONFIG`` is set.
"""

import pytest
from fake_apiserver import FakeApiServer
from kube_helpers import K8S_VERSIONS, endpoint_unit, serving_on, validate_strict
from support.plugin_host import kubernetes_serving
from traitlets import TraitError
from traitlets.config import Config

from gpulab.backend.kubernetes.autoscale import make_hpa, make_scaled_object, quantity
from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.backend.kubernetes.serving_settings import KubernetesServingSettings
from gpulab.backend.spec import SpecError
from gpulab.service.plugins import ConfigError

NS = "gpulab"
IMAGE = "registry.example/gpulab:1"
PVC = "gpulab-models"
DEPLOYMENTS = "/apis/apps/v1/namespaces/gpulab/deployments"
HPAS = "/apis/autoscaling/v2/namespaces/gpulab/horizontalpodautoscalers"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/gpulab/scaledobjects"
PROMETHEUS = "http://prometheus.monitoring.svc:9090"
# A unit: version 2 of endpoint "resnet" (its id is not the deployment's).
UNIT = endpoint_unit(
    id="5e6f7a8b9c0d",
    version=2,
    replicas=1,
    min_replicas=0,
    max_replicas=4,
    target_inflight=2.5,
    scale_down_delay_s=90.0,
)
NAME = "gpulab-ep-d5e6f7a8b9c0d"
ROWS = [{"owner": f"{UNIT['id']}/0", "gpu_uuid": "GPU-0", "milli": 250}]
LABELS = {
    "app.kubernetes.io/name": "gpulab",
    "app.kubernetes.io/managed-by": "gpulab",
    "app.kubernetes.io/component": "endpoint",
    "gpulab.io/endpoint": "d5e6f7a8b9c0d",
}
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0},
    "scaleDown": {"stabilizationWindowSeconds": 90},
}


# -- the objects (pure) ------------------------------------------------------------------
def test_hpa_scales_the_deployment_on_the_units_calls_in_flight():
    hpa = make_hpa(NAME, UNIT)
    assert validate_strict(hpa) == K8S_VERSIONS
    assert hpa["metadata"] == {
        "name": NAME,
        "labels": LABELS,
        "annotations": {"gpulab.io/user": "ann"},
    }
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME}
    # MIN 0 asked, but a plain HPA never goes below one replica.
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 4)
    assert spec["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "gpulab_endpoint_inflight_requests",
                    "selector": {"matchLabels": {"unit": "5e6f7a8b9c0d"}},
                },
                # 2.5 calls in flight per replica.
                "target": {"type": "AverageValue", "averageValue": "2500m"},
            },
        }
    ]
    # Up at once; down after the endpoint's delay.
    assert spec["behavior"] == BEHAVIOR


def test_hpa_keeps_min_and_a_whole_target_as_given():
    hpa = make_hpa(NAME, {**UNIT, "min_replicas": 2, "target_inflight": 4.0})
    validate_strict(hpa)
    assert hpa["spec"]["minReplicas"] == 2
    assert hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "4"
    assert [quantity(v) for v in (1, 0.5, 12.0, 0.001)] == ["1", "500m", "12", "1m"]
    # Another metric name (e.g. one the adapter renamed).
    other = make_hpa(NAME, UNIT, metric="gpulab_inflight")
    assert other["spec"]["metrics"][0]["external"]["metric"]["name"] == "gpulab_inflight"


def test_scale_down_delay_is_held_to_what_the_hpa_api_allows():
    hpa = make_hpa(NAME, {**UNIT, "scale_down_delay_s": 7200.0})
    validate_strict(hpa)  # the API refuses windows over an hour
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600


def test_scaled_object_fields():
    """No schema ships for KEDA's CRD: every field is checked against its documentation."""
    obj = make_scaled_object(NAME, UNIT, prometheus_url=PROMETHEUS)
    assert obj == {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "labels": LABELS, "annotations": {"gpulab.io/user": "ann"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicaCount": 0,  # KEDA scales to zero and back
            "maxReplicaCount": 4,
            "cooldownPeriod": 90,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": PROMETHEUS,
                        "query": 'sum(gpulab_endpoint_inflight_requests{unit="5e6f7a8b9c0d"})',
                        "threshold": "2.5",
                    },
                }
            ],
        },
    }
    # KEDA reads trigger metadata as strings only.
    assert all(isinstance(v, str) for v in obj["spec"]["triggers"][0]["metadata"].values())


@pytest.mark.parametrize(
    "change,message",
    [
        ({"target_inflight": 0}, "'target_inflight' must be a number > 0"),
        ({"max_replicas": 0}, "'max_replicas' must be >= max"),
        ({"min_replicas": -1}, "'min_replicas' must be an integer >= 0"),
        ({"scale_down_delay_s": -1}, "'scale_down_delay_s' must be seconds >= 0"),
    ],
)
def test_builders_refuse_bad_settings(change, message):
    for build in (make_hpa, lambda n, d: make_scaled_object(n, d, prometheus_url=PROMETHEUS)):
        with pytest.raises(SpecError, match=message):
            build(NAME, {**UNIT, **change})
    with pytest.raises(SpecError, match="prometheus_url"):
        make_scaled_object(NAME, UNIT, prometheus_url="")


# -- the backend against a fake API server -------------------------------------------------
@pytest.fixture
async def server():
    server = await FakeApiServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def backend(server, tmp_path):
    """Makes KubernetesServing backends talking to ``server``; closes their clients after."""
    made = []

    def make(autoscaler="service", **kw):
        serving = serving_on(server, tmp_path, autoscaler=autoscaler, **kw)
        serving.prepare(UNIT["id"])
        made.append(serving)
        return serving

    yield make
    for serving in made:
        await serving.close()


def sent(server, method, collection=None):
    return [
        (path, body)
        for m, path, body in server.requests
        if m == method and (collection is None or path.startswith(collection))
    ]


async def test_scale_patches_the_deployments_replicas(server, backend):
    serving = backend()  # the service's own autoscaler decides
    unit = {**UNIT, "min_replicas": 1}
    await serving.launch(unit, ROWS)
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 1
    await serving.scale(unit, 3, ROWS * 2)
    assert sent(server, "PATCH") == [(f"{DEPLOYMENTS}/{NAME}", {"spec": {"replicas": 3}})]
    deployment = server.get(DEPLOYMENTS, NAME)
    assert deployment["spec"]["replicas"] == 3
    validate_strict(deployment)  # the rest of the spec is as launched
    await serving.scale({**unit, "replicas": 3}, 0, [])  # the service's scale to zero
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 0
    # No autoscaler object: the service decides, so none is made or deleted.
    assert not [p for _, p, _ in server.requests if "autoscal" in p or "keda" in p]
    health = await serving.check({**unit, "replicas": 0})
    assert health.replicas is None


async def test_launch_with_hpa_makes_it_and_stop_deletes_it(server, backend):
    serving = backend("hpa")
    assert serving.cluster_autoscales(UNIT)
    await serving.launch(UNIT, ROWS)
    ((path, hpa),) = sent(server, "POST", HPAS)
    assert path == HPAS and hpa == make_hpa(NAME, UNIT)
    validate_strict(hpa)
    # The HPA decides: it asks for 3 replicas, 2 answer ready; check reports its count.
    server.objects[f"{DEPLOYMENTS}/{NAME}"]["spec"]["replicas"] = 3
    server.set_status(DEPLOYMENTS, NAME, {"replicas": 3, "readyReplicas": 2})
    health = await serving.check(UNIT)
    assert (health.replicas, health.ready, health.state) == (3, 2, "starting")
    assert health.message == "2 of 3 replicas ready"
    assert serving.ready_replicas(UNIT) == [(0, f"http://{NAME}.{NS}.svc:80")]
    server.set_status(DEPLOYMENTS, NAME, {"replicas": 3, "readyReplicas": 3})
    health = await serving.check(UNIT)
    assert (health.replicas, health.state) == (3, "running")

    # After a restart of the service: launched again, the HPA replaced, its count kept.
    await serving.launch({**UNIT, "target_inflight": 5.0}, ROWS)
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 3
    stored = server.get(HPAS, NAME)
    assert stored["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "5"
    assert [p for p, _ in sent(server, "PUT", HPAS)] == [f"{HPAS}/{NAME}"]

    await serving.stop(UNIT)
    deletes = [p for p, _ in sent(server, "DELETE")]
    # The HPA goes first, so that it scales nothing back up.
    assert deletes[0] == f"{HPAS}/{NAME}" and f"{DEPLOYMENTS}/{NAME}" in deletes
    assert server.get(HPAS, NAME) is None and server.get(DEPLOYMENTS, NAME) is None
    await serving.stop(UNIT)  # what is gone is fine


async def test_hpa_endpoint_starts_at_one_replica(server, backend):
    """An HPA leaves a Deployment at zero replicas alone: MIN 0 still starts one."""
    serving = backend("hpa")
    await serving.launch({**UNIT, "replicas": 0}, ROWS)
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 1
    health = await serving.check({**UNIT, "replicas": 0})
    assert (health.replicas, health.state) == (1, "starting")  # the service follows


async def test_bad_autoscaling_settings_send_nothing(server, backend):
    serving = backend("hpa")
    with pytest.raises(SpecError, match="target_inflight"):
        await serving.launch({**UNIT, "target_inflight": 0}, ROWS)
    assert sent(server, "POST") == []


async def test_launch_with_keda_makes_a_scaled_object(server, backend):
    serving = backend("keda", prometheus_url=PROMETHEUS)
    await serving.launch(UNIT, ROWS)
    ((path, obj),) = sent(server, "POST", SCALED_OBJECTS)
    assert obj == make_scaled_object(NAME, UNIT, prometheus_url=PROMETHEUS)
    # KEDA took the endpoint to zero: nothing to send calls to.
    server.objects[f"{DEPLOYMENTS}/{NAME}"]["spec"]["replicas"] = 0
    health = await serving.check(UNIT)
    assert (health.replicas, health.ready) == (0, 0)
    assert serving.ready_replicas(UNIT) == []
    # A custom resource is replaced at the version read (the API server's resourceVersion).
    server.objects[f"{SCALED_OBJECTS}/{NAME}"]["metadata"]["resourceVersion"] = "41"
    await serving.launch(UNIT, ROWS)
    ((path, replaced),) = sent(server, "PUT", SCALED_OBJECTS)
    assert path == f"{SCALED_OBJECTS}/{NAME}" and replaced["metadata"]["resourceVersion"] == "41"
    assert server.get(DEPLOYMENTS, NAME)["spec"]["replicas"] == 0  # KEDA's count kept
    await serving.stop(UNIT)
    assert sent(server, "DELETE")[0][0] == f"{SCALED_OBJECTS}/{NAME}"
    assert server.get(SCALED_OBJECTS, NAME) is None


async def test_a_fixed_count_is_not_autoscaled(server, backend):
    fixed = {**UNIT, "replicas": 2, "min_replicas": 2, "max_replicas": 2}
    for autoscaler, kw in (("service", {}), ("hpa", {}), ("keda", {"prometheus_url": PROMETHEUS})):
        assert backend(autoscaler, **kw).cluster_autoscales(fixed) is False
        assert backend(autoscaler, **kw).cluster_autoscales(UNIT) is (autoscaler != "service")
    serving = backend("hpa")
    await serving.launch(fixed, ROWS)
    assert sent(server, "POST", HPAS) == []
    # One left from a launch when the count could still move is removed (none here: fine).
    assert [p for p, _ in sent(server, "DELETE")] == [f"{HPAS}/{NAME}"]
    server.set_status(DEPLOYMENTS, NAME, {"readyReplicas": 2})
    health = await serving.check(fixed)
    assert (health.state, health.replicas) == ("running", None)


# -- settings ------------------------------------------------------------------------------
def test_settings_choose_the_autoscaler(tmp_path):
    base = {"namespace": NS, "models_pvc": PVC, "image": IMAGE}
    serving = kubernetes_serving(base, str(tmp_path))
    assert serving.autoscaler == "service"
    serving = kubernetes_serving(
        {**base, "autoscaler": "keda", "prometheus_url": PROMETHEUS}, str(tmp_path)
    )
    assert (serving.autoscaler, serving.prometheus_url) == ("keda", PROMETHEUS)
    c = Config()
    c.KubernetesServingSettings.autoscaler = "hpa"
    assert KubernetesServingSettings(config=c).autoscaler == "hpa"
    assert kubernetes_serving(base, str(tmp_path), config=c).autoscaler == "hpa"


def test_settings_refuse_an_unknown_autoscaler_or_keda_without_prometheus(tmp_path):
    with pytest.raises(TraitError, match=r"KubernetesServingSettings.autoscaler = 'knative'"):
        KubernetesServingSettings(autoscaler="knative")
    with pytest.raises(
        ConfigError, match=r"kubernetes_deployments: .*'knative': use one of 'service', 'hpa'"
    ):
        kubernetes_serving({"autoscaler": "knative"}, str(tmp_path))
    with pytest.raises(ConfigError, match="prometheus_url"):
        kubernetes_serving(
            {"namespace": NS, "models_pvc": PVC, "image": IMAGE, "autoscaler": "keda"},
            str(tmp_path),
        )
    with pytest.raises(TraitError, match="autoscaler = 'x'"):
        KubernetesServing(str(tmp_path), namespace=NS, models_pvc=PVC, image=IMAGE, autoscaler="x")
