"""The Helm chart, rendered offline (helm-python-sdk), linted, and every object validated.

gpulab's chart has no dependency (it installs beside a z2jh release); the wiring
into z2jh is checked from z2jh-values.yaml and the umbrella chart
(helm/gpulab-jupyterhub) that installs both, whose z2jh dependency cannot be
downloaded here. tests/kube/test_live_cluster.py installs the chart on a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import helm_python as helm
import jsonschema
import pytest
import yaml
from crd_schemas import check_kueue
from kube_helpers import CRD_GROUPS, K8S_VERSIONS, validate_strict

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpulab"
UMBRELLA = ROOT / "helm" / "gpulab-jupyterhub"
Z2JH_VALUES = yaml.safe_load((CHART / "z2jh-values.yaml").read_text())
ALL_ON = yaml.safe_load((Path(__file__).parent / "values-all-on.yaml").read_text())
HUB_OFF = {"jupyterhub": {"enabled": False}}
BACKENDS = ["hami", "mig", "mps", "timeslice", "nvml-cgroup", "kai", "volcano", "dra"]


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(str(CHART)) as c:
        yield c


def render(chart, values, namespace="gpulab") -> dict[str, dict]:
    """``{"Kind/name": object}`` for everything the chart renders."""
    out = chart.render(values, name="gpulab", namespace=namespace, is_install=True)
    objects = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def test_all_options_render_and_validate(chart):
    objects = render(chart, ALL_ON)
    assert sorted(objects) == [
        "ClusterQueue/gpu-cluster",
        "ClusterRole/gpulab-gpulab-all-inventory",
        "ClusterRoleBinding/gpulab-gpulab-all-inventory",
        "ConfigMap/gpulab-all-service",
        "ConfigMap/gpulab-hub-config",
        "DaemonSet/gpulab-all-agent",
        "Deployment/gpulab-all",
        "Deployment/gpulab-all-mlflow",
        "LocalQueue/research",
        "NetworkPolicy/gpulab-all-mlflow",
        "NetworkPolicy/gpulab-all-service",
        "PersistentVolumeClaim/gpulab-all-data",
        "PersistentVolumeClaim/gpulab-all-jobs",
        "PersistentVolumeClaim/gpulab-all-mlflow",
        "PersistentVolumeClaim/gpulab-all-models",
        "PriorityClass/gpulab-batch",
        "PriorityClass/gpulab-batch-high",
        "PriorityClass/gpulab-notebook",
        "PriorityClass/gpulab-scavenger",
        "PriorityClass/gpulab-serving",
        "Role/gpulab-all",
        "RoleBinding/gpulab-all",
        "Secret/gpulab-tokens",
        "Service/gpulab-all",
        "Service/gpulab-all-mlflow",
        "ServiceAccount/gpulab-all",
        "WorkloadPriorityClass/gpulab-batch",
        "WorkloadPriorityClass/gpulab-batch-high",
        "WorkloadPriorityClass/gpulab-high",
        "WorkloadPriorityClass/gpulab-low",
        "WorkloadPriorityClass/gpulab-scavenger",
        "WorkloadPriorityClass/gpulab-serving",
    ]
    for key, obj in objects.items():
        if obj["apiVersion"].startswith(CRD_GROUPS):
            check_kueue(obj)  # no schema ships for custom resources: ours (crd_schemas)
            continue
        assert validate_strict(obj) == K8S_VERSIONS, key
    queue = objects["LocalQueue/research"]
    assert queue == {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "research", "labels": queue["metadata"]["labels"]},
        "spec": {"clusterQueue": "gpu-cluster"},
    }
    high = objects["WorkloadPriorityClass/gpulab-high"]
    assert (high["value"], high["description"]) == (10000, "urgent")
    # Every class of the list is a PriorityClass and a WorkloadPriorityClass of one value.
    for name, value in [("serving", 500), ("batch-high", 200), ("batch", 100), ("scavenger", 10)]:
        assert objects[f"PriorityClass/gpulab-{name}"]["value"] == value
        assert objects[f"WorkloadPriorityClass/gpulab-{name}"]["value"] == value
    cq = objects["ClusterQueue/gpu-cluster"]["spec"]
    assert cq["cohort"] == "research-cohort" and cq["queueingStrategy"] == "StrictFIFO"
    assert cq["namespaceSelector"] == {"matchLabels": {"team": "research"}}
    assert cq["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 150},
    }
    assert "fairSharing" not in cq


def test_all_options_reach_the_objects(chart):
    objects = render(chart, ALL_ON)
    deploy = objects["Deployment/gpulab-all"]["spec"]["template"]
    container = deploy["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == "registry.example.org/gpulab:0.1.0-rc1"
    assert env["GPULAB_DB_URL"] == "postgresql://gpulab@db.example.org/gpulab"
    assert env["JUPYTERHUB_API_URL"] == "http://hub.gpulab.svc:8081/hub/api"
    assert deploy["metadata"]["annotations"]["prometheus.io/path"] == "/services/gpulab/metrics"
    # The scrape is on a port of its own, which only Prometheus' pods may reach; the
    # API port only from the pods that call it (users' servers with their tokens).
    assert deploy["metadata"]["annotations"]["prometheus.io/port"] == "10103"
    assert {"name": "metrics", "containerPort": 10103} in container["ports"]
    policy = objects["NetworkPolicy/gpulab-all-service"]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "service"
    assert policy["ingress"] == [
        {"from": API_CALLERS_ALL, "ports": [{"protocol": "TCP", "port": "http"}]},
        {"from": PROMETHEUS, "ports": [{"protocol": "TCP", "port": "metrics"}]},
        ALL_ON["service"]["networkPolicy"]["extraIngress"][0],
    ]
    mlflow_policy = objects["NetworkPolicy/gpulab-all-mlflow"]["spec"]
    assert mlflow_policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "mlflow"
    assert mlflow_policy["ingress"] == [
        {
            "from": [
                {"podSelector": {"matchLabels": {"component": "proxy"}}},
                {"podSelector": {"matchLabels": {"component": "hub"}}},
                {"podSelector": {"matchLabels": selector("gpulab", "service")}},
            ],
            "ports": [{"protocol": "TCP", "port": "http"}],
        },
        ALL_ON["mlflow"]["networkPolicy"]["extraIngress"][0],
    ]
    assert deploy["spec"]["tolerations"][0]["key"] == "dedicated"
    agent = objects["DaemonSet/gpulab-all-agent"]["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia"
    assert "--interval=2.5" in agent["containers"][0]["command"]
    assert (
        "--service-url=http://gpulab-all.gpulab.svc:10101/services/gpulab/api/v1/telemetry"
        in agent["containers"][0]["command"]
    )
    pvc = objects["PersistentVolumeClaim/gpulab-all-data"]
    assert pvc["spec"]["storageClassName"] == "fast-ssd"
    # MLflow: its pod behind the hub, its tables in the site's PostgreSQL (schema mlflow),
    # and the service writes jobs' runs there.
    mlflow = objects["Deployment/gpulab-all-mlflow"]["spec"]["template"]["spec"]["containers"][0]
    mlflow_env = {e["name"]: e.get("value") for e in mlflow["env"]}
    assert mlflow["command"] == ["python", "-m", "gpulab.service.experiments"]
    assert mlflow_env["GPULAB_DB_URL"] == "postgresql://gpulab@db.example.org/gpulab"
    assert mlflow_env["JUPYTERHUB_SERVICE_PREFIX"] == "/services/mlflow/"
    assert env["GPULAB_MLFLOW_URL"] == "http://gpulab-all-mlflow.gpulab.svc:10102/services/mlflow"
    assert objects["PersistentVolumeClaim/gpulab-all-mlflow"]["spec"]["storageClassName"] == (
        "fast-ssd"
    )
    hub_values = json.loads(objects["ConfigMap/gpulab-hub-config"]["data"]["hub-values.json"])
    assert hub_values == {
        "serviceName": "gpulab",
        "agentServiceName": "gpulab-agent",
        "serviceUrl": "http://gpulab-all.gpulab.svc:10101",
        "apiUrl": "http://gpulab-all.gpulab.svc:10101/services/gpulab/api/v1",
        "publicApiUrl": "https://hub.example.org/services/gpulab/api/v1",
        "mlflowUrl": "http://gpulab-all-mlflow.gpulab.svc:10102",
        "publicMlflowUrl": "https://hub.example.org/services/mlflow",
        "enforcement": ALL_ON["enforcement"],
        "notebookPriorityClass": "gpulab-notebook",
    }
    service_values = service_values_of(objects, "gpulab-all")
    assert service_values["slices"] == ALL_ON["slices"]
    assert service_values["authenticatePrometheus"] is False
    assert service_values["metricsPort"] == 10103
    assert service_values["kueue"] == {
        "enabled": True,
        "localQueue": "research",
        "defaultPriorityClass": "gpulab-low",
    }
    assert service_values["priorityClasses"]["prefix"] == "gpulab-"


def test_the_service_policy_admits_only_its_callers(chart):
    """By default: the API port from z2jh's hub, proxy and users' servers and the node
    agents, metricsPort from Prometheus' pods in namespace monitoring; nothing else
    reaches the service pods (no other port, no other namespace). An empty
    prometheus.from would admit every pod to every series: refused."""
    objects = render(chart, HUB_OFF)
    policy = objects["NetworkPolicy/gpulab-service"]
    validate_strict(policy)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": API_CALLERS_ALL, "ports": [{"protocol": "TCP", "port": "http"}]},
        {"from": PROMETHEUS, "ports": [{"protocol": "TCP", "port": "metrics"}]},
    ]
    # The agents it admits are the ones the chart runs, by their pods' labels.
    agent = objects["DaemonSet/gpulab-agent"]["spec"]["template"]["metadata"]["labels"]
    assert selector("gpulab", "agent").items() <= agent.items()
    with pytest.raises(helm.HelmError, match="prometheus.from is empty"):
        render(chart, {**HUB_OFF, "prometheus": {"from": []}})
    assert "NetworkPolicy/gpulab-mlflow" not in objects  # made with MLflow only


def selector(instance: str, component: str) -> dict:
    return {
        "app.kubernetes.io/name": "gpulab",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
    }


def api_callers(instance: str) -> list[dict]:
    """Who may call the service's API port: z2jh's hub, proxy and users' servers (by
    their component label, in the namespace) and the release's node agents."""
    return [
        {"podSelector": {"matchLabels": {"component": "hub"}}},
        {"podSelector": {"matchLabels": {"component": "proxy"}}},
        {"podSelector": {"matchLabels": {"component": "singleuser-server"}}},
        {"podSelector": {"matchLabels": selector(instance, "agent")}},
    ]


#: prometheus.from by default: Prometheus' pods in namespace "monitoring" only.
PROMETHEUS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]
API_CALLERS_ALL = api_callers("gpulab")


def service_values_of(objects: dict, release: str = "gpulab") -> dict:
    """The values JSON the chart hands the service's config file."""
    return json.loads(objects[f"ConfigMap/{release}-service"]["data"]["service-values.json"])


def volume_mounts(objects: dict, deployment: str) -> tuple[dict, dict]:
    """``({mount path: volume name}, {volume name: volume})`` of the service's pod."""
    spec = objects[f"Deployment/{deployment}"]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    return mounts, {v["name"]: v for v in spec["volumes"]}


def test_kubernetes_jobs_get_a_shared_jobs_directory(chart):
    objects = render(chart, ALL_ON)
    pvc = objects["PersistentVolumeClaim/gpulab-all-jobs"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs-rwx",
        "resources": {"requests": {"storage": "500Gi"}},
    }
    # The service's <data-dir>/jobs is the claim (job pods mount it at the same path).
    mounts, volumes = volume_mounts(objects, "gpulab-all")
    env = {
        e["name"]: e.get("value")
        for e in objects["Deployment/gpulab-all"]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert mounts["/srv/gpulab/jobs"] == "jobs" and env["GPULAB_DATA_DIR"] == "/srv/gpulab"
    assert volumes["jobs"]["persistentVolumeClaim"] == {"claimName": "gpulab-all-jobs"}
    assert mounts["/srv/gpulab"] == "data"  # the ledger's volume stays beside it
    service_values = service_values_of(objects, "gpulab-all")
    assert service_values["kubernetesJobs"] == {
        "enabled": True,
        "namespace": "gpulab",
        "jobsPvc": "gpulab-all-jobs",
        "useJobSet": "auto",
        "priorityClassName": "batch-low",
        "rdzvPort": 29500,
        "podSecurity": {"runAsUser": 1001, "runAsGroup": 1001, "fsGroup": 1001},
        "allowedImages": ["registry.example.org/gpulab-*", "ghcr.io/example/*"],
        "egressBlockedCIDRs": [
            "169.254.169.254/32",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
        ],
    }
    # The service's Role covers what the backend does with a job's objects, and no
    # more (tests/kube/test_chart_rbac.py holds it to every call of the code).
    rules = objects["Role/gpulab-all"]["rules"]

    def allowed(group, resource, verbs):
        return any(
            group in r["apiGroups"] and resource in r["resources"] and set(verbs) <= set(r["verbs"])
            for r in rules
        )

    for group, resource, verbs in [
        ("batch", "jobs", ["get", "create", "patch", "delete"]),
        ("jobset.x-k8s.io", "jobsets", ["get", "create", "patch", "delete"]),
        ("", "services", ["create", "patch", "delete"]),
        # The job's rendezvous Secret and NetworkPolicy, made owned by the Job (patch).
        ("", "secrets", ["create", "patch", "delete"]),
        ("networking.k8s.io", "networkpolicies", ["create", "patch", "delete"]),
        ("kueue.x-k8s.io", "workloads", ["list"]),
    ]:
        assert allowed(group, resource, verbs), (group, resource)
    # A job's Secret is never read back: no get, list or watch of any Secret.
    assert not any(allowed("", "secrets", [verb]) for verb in ("get", "list", "watch"))


def test_kubernetes_jobs_on_an_existing_claim(chart):
    values = {
        **HUB_OFF,
        "jobs": {
            "kubernetes": {"enabled": True, "useJobSet": False},
            "storage": {"existingClaim": "team-nfs"},
        },
    }
    objects = render(chart, values, namespace="research")
    # The chart's own claims: the ledger's and the models' (endpoints are on too).
    assert sorted(k for k in objects if k.startswith("PersistentVolumeClaim/")) == [
        "PersistentVolumeClaim/gpulab-data",
        "PersistentVolumeClaim/gpulab-models",
    ]
    mounts, volumes = volume_mounts(objects, "gpulab")
    assert volumes[mounts["/srv/gpulab/jobs"]]["persistentVolumeClaim"] == {"claimName": "team-nfs"}
    validate_strict(objects["Deployment/gpulab"])
    service_values = service_values_of(objects)
    jobs = service_values["kubernetesJobs"]
    assert (jobs["namespace"], jobs["jobsPvc"], jobs["useJobSet"]) == (
        "research",
        "team-nfs",
        False,
    )


def test_jobs_and_endpoints_are_pods_of_their_own_by_default(chart):
    """The service pod holds the hub's tokens and gpulab's database: by default no
    user code runs in it. Jobs and endpoints are pods on their shared claims, and the
    service is told that nothing of a user's may run beside it."""
    objects = render(chart, HUB_OFF)
    assert {"PersistentVolumeClaim/gpulab-jobs", "PersistentVolumeClaim/gpulab-models"} <= set(
        objects
    )
    mounts, _ = volume_mounts(objects, "gpulab")
    assert (mounts["/srv/gpulab/jobs"], mounts["/srv/gpulab/deployments"]) == ("jobs", "models")
    service_values = service_values_of(objects)
    assert service_values["kubernetesJobs"]["enabled"] is True
    assert service_values["kubernetesDeployments"]["enabled"] is True
    assert service_values["userCodeInServicePod"] is False


@pytest.mark.parametrize("part", ["jobs", "deployments"])
def test_user_code_in_the_service_pod_only_where_the_installer_accepts_it(chart, part):
    """Turning jobs or endpoints on Kubernetes off would run them in the service pod:
    the install stops with the fix, unless service.allowUserCodeInServicePod says yes."""
    values = {**HUB_OFF, part: {"kubernetes": {"enabled": False}}}
    with pytest.raises(
        helm.HelmError,
        match=rf"{part}\.kubernetes\.enabled is false: .* service pod, .*; set it true "
        rf".* service\.allowUserCodeInServicePod: true",
    ):
        render(chart, values)
    objects = render(chart, {**values, "service": {"allowUserCodeInServicePod": True}})
    service_values = service_values_of(objects)
    assert service_values["userCodeInServicePod"] is True
    key = {"jobs": "kubernetesJobs", "deployments": "kubernetesDeployments"}[part]
    assert service_values[key]["enabled"] is False


def test_kubernetes_deployments_get_a_shared_models_directory(chart):
    objects = render(chart, ALL_ON)
    pvc = objects["PersistentVolumeClaim/gpulab-all-models"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs-rwx",
        "resources": {"requests": {"storage": "200Gi"}},
    }
    assert pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "models"
    # The service's <data-dir>/deployments is the claim (model-server pods mount it there too).
    mounts, volumes = volume_mounts(objects, "gpulab-all")
    assert mounts["/srv/gpulab/deployments"] == "models"
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "gpulab-all-models"}
    # Beside the ledger's volume and the jobs claim, each under its own name.
    assert (mounts["/srv/gpulab"], mounts["/srv/gpulab/jobs"]) == ("data", "jobs")
    spec = objects["Deployment/gpulab-all"]["spec"]["template"]["spec"]
    assert len({v["name"] for v in spec["volumes"]}) == len(spec["volumes"])
    service_values = service_values_of(objects, "gpulab-all")
    assert service_values["kubernetesDeployments"] == {
        "enabled": True,
        "namespace": "gpulab",
        "modelsPvc": "gpulab-all-models",
        "image": "registry.example.org/gpulab-singleuser:0.1.0-rc1",
        "priorityClassName": "serving-high",
        "autoscaler": "keda",
        "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
        "podSecurity": {"runAsUser": 1002, "runAsGroup": 1002, "fsGroup": 1002},
        "egressCIDRs": ["10.20.0.0/16"],
    }
    # The service's Role covers what the backend does with an endpoint's objects.
    rules = objects["Role/gpulab-all"]["rules"]

    def allowed(group, resource, verbs):
        return any(
            group in r["apiGroups"] and resource in r["resources"] and set(verbs) <= set(r["verbs"])
            for r in rules
        )

    for group, resource, verbs in [
        ("apps", "deployments", ["create", "get", "update", "patch", "delete"]),
        ("", "services", ["create", "patch", "delete"]),
        ("", "secrets", ["create", "update", "delete"]),
        ("", "pods", ["list"]),
        ("", "pods/log", ["get"]),
    ]:
        assert allowed(group, resource, verbs), (group, resource)


def role_allows(objects: dict, role: str, group: str, resource: str, verbs: list[str]) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and set(verbs) <= set(r["verbs"])
        for r in objects[f"Role/{role}"]["rules"]
    )


#: What the serving backend does with an endpoint's autoscaler (replace = update).
AUTOSCALER_VERBS = {
    "hpa": ["create", "update", "delete"],
    "keda": ["get", "create", "update", "delete"],
}


@pytest.mark.parametrize("autoscaler", ["service", "hpa", "keda"])
def test_endpoint_autoscaler_gets_its_rights_only_when_chosen(chart, autoscaler):
    """The service's Role may make HPAs or ScaledObjects only where it is told to make them."""
    endpoints = {"enabled": True, "autoscaler": autoscaler}
    if autoscaler == "keda":
        endpoints["prometheusUrl"] = "http://prometheus.monitoring.svc:9090"
    objects = render(chart, {**HUB_OFF, "deployments": {"kubernetes": endpoints}})
    validate_strict(objects["Role/gpulab"])
    hpa_verbs, keda_verbs = AUTOSCALER_VERBS["hpa"], AUTOSCALER_VERBS["keda"]
    hpa = role_allows(objects, "gpulab", "autoscaling", "horizontalpodautoscalers", hpa_verbs)
    keda = role_allows(objects, "gpulab", "keda.sh", "scaledobjects", keda_verbs)
    assert (hpa, keda) == (autoscaler == "hpa", autoscaler == "keda")
    # Every autoscaler scales through the Deployment: the service patches its replicas.
    assert role_allows(objects, "gpulab", "apps", "deployments", ["get", "patch"])
    deployments = service_values_of(objects)["kubernetesDeployments"]
    assert deployments["autoscaler"] == autoscaler
    assert deployments["prometheusUrl"] == endpoints.get("prometheusUrl", "")


def test_endpoint_autoscaler_rights_stay_off_with_endpoints_off(chart):
    values = {
        **HUB_OFF,
        "service": {"allowUserCodeInServicePod": True},
        "deployments": {"kubernetes": {"enabled": False, "autoscaler": "hpa"}},
    }
    objects = render(chart, values)
    assert not role_allows(objects, "gpulab", "autoscaling", "horizontalpodautoscalers", ["create"])
    assert service_values_of(objects)["kubernetesDeployments"]["enabled"] is False


def test_keda_needs_prometheus(chart):
    values = {**HUB_OFF, "deployments": {"kubernetes": {"enabled": True, "autoscaler": "keda"}}}
    with pytest.raises(helm.HelmError, match="set deployments.kubernetes.prometheusUrl"):
        render(chart, values)


def test_kubernetes_deployments_on_an_existing_claim(chart):
    values = {
        **HUB_OFF,
        "deployments": {
            "kubernetes": {"enabled": True},
            "storage": {"existingClaim": "team-models"},
        },
    }
    objects = render(chart, values, namespace="research")
    # The chart's own claims: the ledger's and the jobs' (jobs are on too).
    assert sorted(k for k in objects if k.startswith("PersistentVolumeClaim/")) == [
        "PersistentVolumeClaim/gpulab-data",
        "PersistentVolumeClaim/gpulab-jobs",
    ]
    mounts, volumes = volume_mounts(objects, "gpulab")
    assert volumes[mounts["/srv/gpulab/deployments"]]["persistentVolumeClaim"] == {
        "claimName": "team-models"
    }
    assert mounts["/srv/gpulab/jobs"] == "jobs"  # each has its own claim
    validate_strict(objects["Deployment/gpulab"])
    service_values = service_values_of(objects)
    deployments = service_values["kubernetesDeployments"]
    # The default image is the notebook image (it has gpulab and torch).
    assert (deployments["namespace"], deployments["modelsPvc"], deployments["image"]) == (
        "research",
        "team-models",
        "ghcr.io/gpulab/gpulab-singleuser:0.1.0",
    )


def test_default_endpoint_image_is_the_notebook_image():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["deployments"]["kubernetes"]["image"] == Z2JH_VALUES["singleuser"]["image"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_defaults_render_for_every_backend(chart, backend):
    objects = render(chart, {**HUB_OFF, "enforcement": {"backend": backend}})
    assert "LocalQueue/gpulab" not in objects  # Kueue is off by default
    # The backend reaches only the hub's ConfigMap: validate everything once.
    for obj in objects.values() if backend == "hami" else [objects["ConfigMap/gpulab-hub-config"]]:
        validate_strict(obj)
    hub_values = json.loads(objects["ConfigMap/gpulab-hub-config"]["data"]["hub-values.json"])
    assert hub_values["enforcement"] == {"backend": backend, "options": {}}
    tokens = objects["Secret/gpulab-tokens"]["data"]
    assert set(tokens) == {"service-token", "agent-token", "mlflow-token"}
    assert "Deployment/gpulab-mlflow" not in objects  # MLflow is off by default


def test_service_pod_takes_the_sites_extras(chart):
    """``service.extra*``, as z2jh's ``hub.extra*``: variables, volumes and mounts of the
    site's own in the service's pod, and Python run after the chart's configuration."""
    extras = {
        "service": {
            "extraEnv": [{"name": "GPULAB_CA_FILE", "value": "/etc/site-ca/ca.crt"}],
            "extraVolumes": [{"name": "site-ca", "configMap": {"name": "site-ca"}}],
            "extraVolumeMounts": [{"name": "site-ca", "mountPath": "/etc/site-ca"}],
            "extraConfig": 'c.KubernetesServingSettings.priority_class = "serving"\n',
        }
    }
    objects = render(chart, extras)
    container = objects["Deployment/gpulab"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPULAB_CA_FILE"] == "/etc/site-ca/ca.crt"
    assert env["JUPYTERHUB_SERVICE_NAME"] == "gpulab"  # the chart's own stay
    mounts, volumes = volume_mounts(objects, "gpulab")
    assert mounts["/etc/site-ca"] == "site-ca" and mounts["/srv/gpulab"] == "data"
    assert volumes["site-ca"]["configMap"] == {"name": "site-ca"}
    config = objects["ConfigMap/gpulab-service"]["data"]["gpulab_config.py"]
    chart_part, _, site_part = config.partition("# service.extraConfig")
    assert "c.InventorySettings.inventory_source" in chart_part
    assert 'c.KubernetesServingSettings.priority_class = "serving"' in site_part
    # Without them the pod and the file are the chart's alone.
    plain = render(chart, {})
    assert (
        "service.extraConfig" not in plain["ConfigMap/gpulab-service"]["data"]["gpulab_config.py"]
    )
    assert "site-ca" not in json.dumps(plain["Deployment/gpulab"])


def test_minimal_install_without_agent_rbac_or_scraping(chart):
    objects = render(
        chart,
        {
            **HUB_OFF,
            "agent": {"enabled": False},
            "rbac": {"create": False},
            "prometheus": {"scrape": False},
            "service": {"persistence": {"enabled": False}},
            "notebookPriorityClass": {"create": False},
            "priorityClasses": {"create": False},
        },
    )
    assert sorted(k.split("/")[0] for k in objects) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        # The service's policy, made without the scrape too: its port only to its callers.
        "NetworkPolicy",
        # The jobs' and the models' shared claims: job and model-server pods mount them.
        "PersistentVolumeClaim",
        "PersistentVolumeClaim",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    for obj in objects.values():
        validate_strict(obj)
    # Without the scrape, Prometheus reads /metrics on the API port with a token: the
    # pods prometheus.from selects join the API port's callers; no metrics port.
    policy = objects["NetworkPolicy/gpulab-service"]["spec"]
    assert policy["ingress"] == [
        {"from": [*API_CALLERS_ALL, *PROMETHEUS], "ports": [{"protocol": "TCP", "port": "http"}]}
    ]
    template = objects["Deployment/gpulab"]["spec"]["template"]
    assert "prometheus.io/scrape" not in template["metadata"]["annotations"]
    assert {"name": "data", "emptyDir": {}} in template["spec"]["volumes"]
    hub_values = json.loads(objects["ConfigMap/gpulab-hub-config"]["data"]["hub-values.json"])
    assert hub_values["notebookPriorityClass"] == ""
    # No gpulab-<class> objects: pods name none (only priorityClassName, when set).
    assert service_values_of(objects)["priorityClasses"]["prefix"] == ""


@pytest.mark.parametrize("values", [ALL_ON, HUB_OFF], ids=["all-on", "defaults"])
def test_lint(values):
    for version in K8S_VERSIONS:
        report = helm.lint(str(CHART), values, kube_version=f"v{version}.0")
        assert report["errors"] == []
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        # No dependency to miss: the chart installs without z2jh's (helm refuses a
        # chart whose dependency is missing, even one whose condition is false).
        assert [m["error"] for m in problems] == []


def test_values_match_their_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema)
    jsonschema.validate(ALL_ON, schema)


@pytest.mark.parametrize(
    "bad,message",
    [
        (
            {"enforcement": {"backend": "nvshare"}},
            "at '/enforcement/backend': value must be one of",
        ),
        ({"slices": {"sizes": [-250], "policy": "best-fit"}}, "at '/slices/sizes/0'"),
        ({"service": {"port": 0}}, "at '/service/port'"),
        ({"servce": {}}, "additional properties 'servce' not allowed"),
        ({"jobs": {"kubernetes": {"useJobSet": "yes"}}}, "at '/jobs/kubernetes/useJobSet'"),
        ({"jobs": {"storage": {"size": "lots"}}}, "at '/jobs/storage/size'"),
        ({"deployments": {"storage": {"size": "lots"}}}, "at '/deployments/storage/size'"),
        (
            {"deployments": {"kubernetes": {"image": {"name": ""}}}},
            "at '/deployments/kubernetes/image/name'",
        ),
        (
            {"deployments": {"kubernetes": {"queue": "x"}}},
            "additional properties 'queue' not allowed",
        ),
        (
            {"deployments": {"kubernetes": {"autoscaler": "knative"}}},
            "at '/deployments/kubernetes/autoscaler'",
        ),
        (
            {
                "priorityClasses": {
                    "classes": [{"name": "batch", "value": 100, "preemptionPolicy": "Sometimes"}]
                }
            },
            "at '/priorityClasses/classes/0/preemptionPolicy'",
        ),
        (
            {"priorityClasses": {"classes": [{"name": "Batch", "value": 100}]}},
            "at '/priorityClasses/classes/0/name'",
        ),
        (
            {"priorityClasses": {"classes": [{"name": "top", "value": 2000000000}]}},
            "at '/priorityClasses/classes/0/value'",
        ),
        (
            {"kueue": {"clusterQueue": {"preemption": {"withinClusterQueue": "Any"}}}},
            "at '/kueue/clusterQueue/preemption/withinClusterQueue'",
        ),
    ],
)
def test_schema_refuses_bad_values(chart, bad, message):
    with pytest.raises(helm.HelmError, match=message):
        chart.validate_schema({**HUB_OFF, **bad})


def test_z2jh_wiring_names_what_the_chart_creates():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    hub = Z2JH_VALUES["hub"]
    integration = values["hubIntegration"]
    volume = next(v for v in hub["extraVolumes"] if v["name"] == "gpulab-hub-config")
    assert volume["configMap"]["name"] == integration["configMapName"]
    for var in ("GPULAB_SERVICE_TOKEN", "GPULAB_AGENT_TOKEN"):
        assert (
            hub["extraEnv"][var]["valueFrom"]["secretKeyRef"]["name"]
            == integration["tokenSecretName"]
        )
    mounts = {m["subPath"]: m["mountPath"] for m in hub["extraVolumeMounts"]}
    # z2jh's jupyterhub_config.py loads every *.py in jupyterhub_config.d.
    assert mounts["gpulab_hub_config.py"] == (
        "/usr/local/etc/jupyterhub/jupyterhub_config.d/gpulab_hub_config.py"
    )
    assert mounts["hub-values.json"] == "/usr/local/etc/gpulab/hub-values.json"
    assert "dependencies" not in yaml.safe_load((CHART / "Chart.yaml").read_text())
    umbrella = yaml.safe_load((UMBRELLA / "Chart.yaml").read_text())
    assert umbrella["dependencies"] == [
        {"name": "gpulab", "version": "0.1.0", "repository": "file://../gpulab"},
        {
            "name": "jupyterhub",
            "version": "^4.0.0",
            "repository": "https://hub.jupyter.org/helm-chart/",
            "condition": "jupyterhub.enabled",
        },
    ]
    # The umbrella gives z2jh exactly the wiring a site's own z2jh release gets.
    umbrella_values = yaml.safe_load((UMBRELLA / "values.yaml").read_text())
    assert umbrella_values["jupyterhub"] == {"enabled": True, **Z2JH_VALUES}
    assert umbrella_values["gpulab"]["jupyterhub"]["enabled"] is True
    # Notebook pods reach the service directly; z2jh's egress policy must allow it.
    for part in (Z2JH_VALUES["singleuser"], Z2JH_VALUES["hub"], Z2JH_VALUES["proxy"]["chp"]):
        rule = part["networkPolicy"]["egress"][0]
        selector = rule["to"][0]["podSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == "service"


# -- gpulab's priority classes ---------------------------------------------------------

GPU_QUOTA = [
    {
        "coveredResources": ["nvidia.com/gpu"],
        "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]}
        ],
    }
]


def test_priority_classes_by_default(chart):
    """One PriorityClass per gpulab class, the scheduler's values; interactive is the notebook's."""
    objects = render(chart, HUB_OFF)
    classes = {k: v for k, v in objects.items() if k.startswith("PriorityClass/")}
    assert sorted(classes) == [
        "PriorityClass/gpulab-batch",
        "PriorityClass/gpulab-batch-high",
        "PriorityClass/gpulab-notebook",
        "PriorityClass/gpulab-serving",
    ]
    for obj in classes.values():
        validate_strict(obj)
    got = {
        k.split("/")[1]: (v["value"], v["preemptionPolicy"], v["globalDefault"])
        for k, v in classes.items()
    }
    assert got == {
        # Servers' class as before (a PriorityClass's value cannot change in place).
        "gpulab-notebook": (1000000, "Never", False),
        "gpulab-serving": (500, "PreemptLowerPriority", False),
        "gpulab-batch-high": (200, "PreemptLowerPriority", False),
        # The lowest class evicts no one, not even pods without a PriorityClass.
        "gpulab-batch": (100, "Never", False),
    }
    # The chart's defaults are gpulab's (scheduler/priority.py).
    from gpulab.scheduler.priority import DEFAULT_CLASSES

    values = yaml.safe_load((CHART / "values.yaml").read_text())["priorityClasses"]["classes"]
    assert [
        (c["name"], c["value"], c["preemptible"], c.get("access", "everyone")) for c in values
    ] == [(c.name, c.value, c.preemptible, c.access) for c in DEFAULT_CLASSES]
    assert not [k for k in objects if k.startswith("WorkloadPriorityClass/")]  # Kueue is off
    assert service_values_of(objects)["priorityClasses"]["prefix"] == "gpulab-"


def test_kueue_gets_a_workload_priority_class_per_class(chart):
    objects = render(chart, {**HUB_OFF, "kueue": {"enabled": True}})
    wpcs = {k: v for k, v in objects.items() if k.startswith("WorkloadPriorityClass/")}
    for obj in wpcs.values():
        check_kueue(obj)
    assert {k: v["value"] for k, v in wpcs.items()} == {
        "WorkloadPriorityClass/gpulab-serving": 500,
        "WorkloadPriorityClass/gpulab-batch-high": 200,
        "WorkloadPriorityClass/gpulab-batch": 100,
    }
    for name in ("serving", "batch-high", "batch"):  # the same value as the PriorityClass
        assert (
            objects[f"PriorityClass/gpulab-{name}"]["value"]
            == wpcs[f"WorkloadPriorityClass/gpulab-{name}"]["value"]
        )
    check_kueue(objects["LocalQueue/gpulab"])
    assert "ClusterQueue/gpulab" not in objects  # a cluster admin's unless asked for
    # No fixed WorkloadPriorityClass: each job its own class's.
    assert service_values_of(objects)["kueue"]["defaultPriorityClass"] == ""


def test_cluster_queue_shows_preemption_by_class(chart):
    values = {
        **HUB_OFF,
        "kueue": {"enabled": True, "clusterQueue": {"create": True, "resourceGroups": GPU_QUOTA}},
    }
    objects = render(chart, values, namespace="research")
    cq = objects["ClusterQueue/gpulab"]
    check_kueue(cq)
    assert cq["spec"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "research"}
    }
    assert "cohort" not in cq["spec"]
    # Borrowing preempts up to the highest preemptible class (batch-high), never serving.
    assert cq["spec"]["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 200},
    }
    assert objects["LocalQueue/gpulab"]["spec"]["clusterQueue"] == "gpulab"


def test_cluster_queue_with_fair_sharing_leaves_out_borrow_preemption(chart):
    queue = {
        "create": True,
        "cohort": "lab",
        "resourceGroups": GPU_QUOTA,
        "fairSharing": {"weight": 2},
    }
    objects = render(chart, {**HUB_OFF, "kueue": {"enabled": True, "clusterQueue": queue}})
    cq = objects["ClusterQueue/gpulab"]
    check_kueue(cq)
    assert cq["spec"]["fairSharing"] == {"weight": 2} and cq["spec"]["cohort"] == "lab"
    assert cq["spec"]["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
    }


def test_cluster_queue_needs_quota(chart):
    with pytest.raises(helm.HelmError, match="needs kueue.clusterQueue.resourceGroups"):
        render(chart, {**HUB_OFF, "kueue": {"enabled": True, "clusterQueue": {"create": True}}})


def test_priority_classes_can_be_left_to_the_admin(chart):
    objects = render(
        chart, {**HUB_OFF, "priorityClasses": {"create": False}, "kueue": {"enabled": True}}
    )
    assert [k for k in objects if "PriorityClass/" in k] == ["PriorityClass/gpulab-notebook"]
    assert service_values_of(objects)["priorityClasses"]["prefix"] == ""
