"""The chart's Python config files (files/hub/, files/service/), run on the values it renders."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml
from support.plugin_host import kubernetes_backend
from traitlets.config import Config

from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.hub_ext.admin_page import HUB_PAGES, show_slices_on_admin_page
from gpulab.service.app import GpuLabService
from gpulab.service.hibernation.settings import Hibernation
from gpulab.service.jobs.inventory_settings import InventorySettings
from gpulab.service.jobs.manager import JobManager
from gpulab.service.sharing import SharingSettings
from gpulab.service.telemetry.settings import TelemetrySettings
from gpulab.spawner.admin_slices import slices_template_var
from gpulab.spawner.kube import FractionalKubeSpawner

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpulab"
ALL_ON = yaml.safe_load((Path(__file__).parent / "values-all-on.yaml").read_text())


def rendered_data(values: dict, namespace: str = "hub") -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(
            {"jupyterhub": {"enabled": False}, **values}, name="gpulab", namespace=namespace
        )
    data = {}
    for name in ("configmap-hub.yaml", "configmap-service.yaml"):
        data.update(yaml.safe_load(out[f"gpulab/templates/{name}"])["data"])
    return data


def run_config(source: str, c: Config) -> Config:
    exec(compile(source, "gpulab_config.py", "exec"), {"get_config": lambda: c})
    return c


@pytest.fixture
def hub_config(tmp_path, monkeypatch):
    data = rendered_data({"enforcement": {"backend": "kai", "options": {"queue": "research"}}})
    values = tmp_path / "hub-values.json"
    values.write_text(data["hub-values.json"])
    monkeypatch.setenv("GPULAB_HUB_VALUES", str(values))
    monkeypatch.setenv("GPULAB_SERVICE_TOKEN", "svc-token")
    monkeypatch.setenv("GPULAB_AGENT_TOKEN", "agent-token")
    # What z2jh's jupyterhub_config.py has set by the time it loads jupyterhub_config.d.
    c = Config()
    c.JupyterHub.services = [{"name": "idle-culler", "command": ["cull"]}]
    c.JupyterHub.load_roles = [
        {"name": "user", "scopes": ["self", "read:groups"]},
        {"name": "jupyterhub-idle-culler", "services": ["idle-culler"], "scopes": ["list:users"]},
    ]
    return run_config(data["gpulab_hub_config.py"], c)


def test_hub_config_wires_the_spawner_and_services(hub_config):
    c = hub_config
    assert c.JupyterHub.spawner_class == "gpulab-kube"
    s = c.FractionalKubeSpawner
    assert s.gpulab_api_url == "http://gpulab.hub.svc:10101/services/gpulab/api/v1"
    assert s.gpulab_api_token == "svc-token"
    assert (s.enforcement, s.enforcement_options) == ("kai", {"queue": "research"})
    assert s.notebook_priority_class == "gpulab-notebook"
    assert [x["name"] for x in c.JupyterHub.services] == ["idle-culler", "gpulab", "gpulab-agent"]
    gpulab = c.JupyterHub.services[1]
    assert gpulab["url"] == "http://gpulab.hub.svc:10101" and gpulab["api_token"] == "svc-token"
    assert c.JupyterHub.services[2] == {"name": "gpulab-agent", "api_token": "agent-token"}
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["user"]["scopes"] == ["access:services!service=gpulab", "read:groups", "self"]
    assert "jupyterhub-idle-culler" in roles
    assert roles["gpulab-service"]["services"] == ["gpulab"]


def test_hub_config_shows_slices_on_the_admin_page(hub_config):
    """The chart's hub gets the admin page's "GPU slices" table that `gpulab up` has
    (tests/browser/test_hub_pages.py looks at it there), after a site's own pages."""
    c = hub_config
    assert c.JupyterHub.template_paths[-1] == HUB_PAGES
    assert (Path(HUB_PAGES) / "admin.html").is_file()
    assert c.JupyterHub.template_vars["gpulab_slices"] is slices_template_var
    site = Config()
    site.JupyterHub.template_paths = ["/etc/site-pages"]
    site.JupyterHub.template_vars = {"org": "ACME"}
    show_slices_on_admin_page(site)
    show_slices_on_admin_page(site)
    assert site.JupyterHub.template_paths == ["/etc/site-pages", HUB_PAGES]
    assert set(site.JupyterHub.template_vars) == {"org", "gpulab_slices", "gpulab_holds"}


async def test_hub_config_is_accepted_by_the_spawner(hub_config, offline_kubeconfig):
    spawner = FractionalKubeSpawner(config=hub_config, _mock=True)
    assert spawner.enforcement == "kai" and spawner.gpulab_api_token == "svc-token"


def test_service_config(tmp_path, monkeypatch):
    data = rendered_data(
        {
            "slices": {
                "sizes": [0, 250, 1000],
                "policy": "best-fit",
                "defaultUserQuotaMilli": 1000,
                "groupQuotaMilli": {"students": 2000},
            }
        }
    )
    values = tmp_path / "service-values.json"
    values.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(values))
    c = run_config(data["gpulab_config.py"], Config())
    svc = c.GpuLabService
    placing, sharing = c.InventorySettings, c.SharingSettings
    assert placing.slice_sizes == [0, 250, 1000] and sharing.default_user_quota_milli == 1000
    assert sharing.group_quota_milli == {"students": 2000}
    telemetry = c.TelemetrySettings
    assert telemetry.local_sampler is False and telemetry.authenticate_prometheus is False
    # Every setting the chart writes is one the service (or its part) has.
    assert set(svc) <= set(GpuLabService.class_trait_names())
    assert set(telemetry) <= set(TelemetrySettings.class_trait_names())
    assert set(placing) <= set(InventorySettings.class_trait_names())
    assert set(sharing) <= set(SharingSettings.class_trait_names())
    assert placing.inventory_source == "kubernetes"
    # The chart's priority classes are the service's: gpulab's defaults.
    from gpulab.scheduler.priority import DEFAULT_CLASSES

    assert sharing.priority_classes == [c.to_dict() for c in DEFAULT_CLASSES]


def service_config(tmp_path, monkeypatch, values: dict, namespace: str = "hub") -> Config:
    data = rendered_data(values, namespace)
    path = tmp_path / "service-values.json"
    path.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(path))
    return run_config(data["gpulab_config.py"], Config())


def test_service_config_turns_on_kubernetes_jobs(tmp_path, monkeypatch):
    c = service_config(tmp_path, monkeypatch, ALL_ON, namespace="research")
    assert c.GpuLabService.kubernetes_jobs == {
        "namespace": "research",
        "jobs_pvc": "gpulab-all-jobs",
        "enforcement": "mig",
        "enforcement_options": ALL_ON["enforcement"]["options"],
        "queue": "research",
        "priority": "gpulab-low",
        "priority_class": "batch-low",
        "priority_class_prefix": "gpulab-",
        "use_jobset": "auto",
        "rdzv_port": 29500,
    }
    # The service builds its backend from exactly these settings.
    jobs_root = str(tmp_path / "data" / "jobs")
    backend = kubernetes_backend(c.GpuLabService.kubernetes_jobs, jobs_root, [])
    assert (backend.namespace, backend.use_jobset) == ("research", "auto")
    assert backend.options.jobs_pvc == "gpulab-all-jobs"
    assert backend.options.labels == {
        "kueue.x-k8s.io/queue-name": "research",
        "kueue.x-k8s.io/priority-class": "gpulab-low",
    }
    assert (backend.options.priority_class, backend.options.rdzv_port) == ("batch-low", 29500)


def test_service_config_kubernetes_jobs_without_kueue(tmp_path, monkeypatch):
    c = service_config(
        tmp_path,
        monkeypatch,
        {
            "enforcement": {"backend": "hami"},
            "jobs": {"kubernetes": {"enabled": True}, "storage": {"existingClaim": "team-nfs"}},
        },
    )
    settings = c.GpuLabService.kubernetes_jobs
    assert (settings["namespace"], settings["jobs_pvc"], settings["enforcement"]) == (
        "hub",
        "team-nfs",
        "hami",
    )
    assert (settings["queue"], settings["priority"], settings["use_jobset"]) == ("", "", "auto")
    kubernetes_backend(settings, str(tmp_path / "jobs"), [])


def job_pods(backend, **kw):
    """(the Job's labels, its pods' PriorityClass and labels) of a job of ``kw``."""
    from gpulab.backend.spec import JobSpec

    spec = JobSpec(code="pass", image="registry.example/gpulab:1", id="abc123", **kw)
    job = backend.objects(spec, [], jobset=False)[-1]
    template = job["spec"]["template"]
    return (
        job["metadata"]["labels"],
        template["spec"].get("priorityClassName"),
        template["metadata"]["labels"],
    )


def test_chart_defaults_give_each_job_its_own_class(tmp_path, monkeypatch):
    """Kueue on, nothing fixed: a batch-high job's pods are gpulab-batch-high, in Kueue too."""
    c = service_config(
        tmp_path,
        monkeypatch,
        {"kueue": {"enabled": True}, "jobs": {"kubernetes": {"enabled": True}}},
    )
    backend = kubernetes_backend(c.GpuLabService.kubernetes_jobs, str(tmp_path / "jobs"), [])
    labels, priority_class, _ = job_pods(backend, priority_class="batch-high")
    assert priority_class == "gpulab-batch-high"
    assert labels["kueue.x-k8s.io/priority-class"] == "gpulab-batch-high"
    assert labels["kueue.x-k8s.io/queue-name"] == "gpulab"
    labels, priority_class, _ = job_pods(backend)
    assert (priority_class, labels["kueue.x-k8s.io/priority-class"]) == ("gpulab-batch",) * 2


def test_chart_fixed_classes_still_win(tmp_path, monkeypatch):
    """jobs.kubernetes.priorityClassName and kueue.defaultWorkloadPriorityClass, when
    set (the values of before), name one class for every job."""
    c = service_config(tmp_path, monkeypatch, ALL_ON)
    backend = kubernetes_backend(c.GpuLabService.kubernetes_jobs, str(tmp_path / "jobs"), [])
    labels, priority_class, _ = job_pods(backend, priority_class="batch-high")
    assert priority_class == "batch-low"
    assert labels["kueue.x-k8s.io/priority-class"] == "gpulab-low"


def test_service_config_without_kubernetes_jobs(tmp_path, monkeypatch):
    c = service_config(
        tmp_path,
        monkeypatch,
        {
            "kueue": {"enabled": True},
            "service": {"allowUserCodeInServicePod": True},
            "jobs": {"kubernetes": {"enabled": False}},
        },
    )
    assert "kubernetes_jobs" not in c.GpuLabService
    assert c.GpuLabService.user_code_in_service is True


def test_service_config_turns_on_kubernetes_deployments(tmp_path, monkeypatch):
    c = service_config(tmp_path, monkeypatch, ALL_ON, namespace="research")
    assert c.GpuLabService.kubernetes_deployments == {
        "namespace": "research",
        "models_pvc": "gpulab-all-models",
        "image": "registry.example.org/gpulab-singleuser:0.1.0-rc1",
        "enforcement": "mig",
        "enforcement_options": ALL_ON["enforcement"]["options"],
        "queue": "research",
        "priority": "gpulab-low",
        "priority_class": "serving-high",
        "priority_class_prefix": "gpulab-",
        "autoscaler": "keda",
        "prometheus_url": "http://prometheus-operated.monitoring.svc:9090",
    }


def test_service_config_kubernetes_deployments_without_kueue(tmp_path, monkeypatch):
    c = service_config(
        tmp_path,
        monkeypatch,
        {
            "enforcement": {"backend": "hami"},
            "deployments": {
                "kubernetes": {"enabled": True},
                "storage": {"existingClaim": "team-models"},
            },
        },
    )
    assert c.GpuLabService.kubernetes_deployments == {
        "namespace": "hub",
        "models_pvc": "team-models",
        "image": "ghcr.io/gpulab/gpulab-singleuser:0.1.0",
        "enforcement": "hami",
        "enforcement_options": {},
        "queue": "",
        "priority": "",
        "priority_class": "",
        "priority_class_prefix": "gpulab-",
        "autoscaler": "service",
        "prometheus_url": "",
    }
    assert "kubernetes_jobs" in c.GpuLabService  # jobs have their own switch, on by default


def test_service_config_without_kubernetes_deployments(tmp_path, monkeypatch):
    c = service_config(
        tmp_path,
        monkeypatch,
        {
            "kueue": {"enabled": True},
            "service": {"allowUserCodeInServicePod": True},
            "deployments": {"kubernetes": {"enabled": False}},
        },
    )
    assert "kubernetes_deployments" not in c.GpuLabService
    assert "kubernetes_jobs" in c.GpuLabService


def started_service(tmp_path, monkeypatch, data: dict) -> GpuLabService:
    """The service initialised from the chart's rendered files, as its pod starts it."""
    (tmp_path / "gpulab_config.py").write_text(data["gpulab_config.py"])
    (tmp_path / "service-values.json").write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(tmp_path / "service-values.json"))
    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:9/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "unused")
    # The chart counts the cluster's GPUs (inventory_source "kubernetes"), and no API
    # server runs here: declared GPUs stand in (tests/kube/test_kube_inventory.py reads
    # nodes from a fake API server). Without either, the service refuses to start.
    monkeypatch.setenv("GPULAB_SIMULATE_GPUS", "1xA100-80GB")
    app = GpuLabService()
    app.initialize([f"--config={tmp_path / 'gpulab_config.py'}"])
    return app


def test_service_starts_from_the_chart_config(tmp_path, monkeypatch):
    """The service's own start-up reads the chart's file as the pod runs it."""
    app = started_service(tmp_path, monkeypatch, rendered_data({}))
    assert [c["name"] for c in app.sharing_settings.priority_classes] == [
        "interactive",
        "serving",
        "batch-high",
        "batch",
    ]
    assert app.inventory_settings.slice_sizes == [0, 100, 250, 500, 1000, 2000]
    telemetry = app.telemetry_settings
    assert telemetry.local_sampler is False and telemetry.authenticate_prometheus is False
    assert app.db_url == f"sqlite:///{tmp_path / 'data'}/gpulab.sqlite"


def test_service_builds_the_kubernetes_backend_from_the_chart_config(tmp_path, monkeypatch):
    """With jobs.kubernetes on, the service's job manager has the backend, on <data-dir>/jobs."""
    app = started_service(
        tmp_path,
        monkeypatch,
        rendered_data({"jobs": {"kubernetes": {"enabled": True}}}, namespace="research"),
    )
    manager = app.jobs
    assert isinstance(manager, JobManager)
    kube = manager.backends["kubernetes"]
    assert kube.namespace == "research" and kube.options.jobs_pvc == "gpulab-jobs"
    # The chart mounts the claim at <data-dir>/jobs, the path pods mount it at too.
    assert kube.options.jobs_root == str(tmp_path / "data" / "jobs") == manager.root


def test_service_serves_endpoints_on_kubernetes_from_the_chart_config(tmp_path, monkeypatch):
    """With deployments.kubernetes on, %deploy endpoints become Deployments in the namespace."""
    app = started_service(
        tmp_path,
        monkeypatch,
        rendered_data({"deployments": {"kubernetes": {"enabled": True}}}, namespace="research"),
    )
    serving = app.deployments.serving
    assert isinstance(serving, KubernetesServing) and serving.namespace == "research"
    assert serving.queueing()["priority_class_name"] == "gpulab-serving"  # the serving class
    assert serving.models_pvc == "gpulab-models" and serving.image.endswith(":0.1.0")
    # The chart mounts the claim at <data-dir>/deployments, where the service writes models.
    assert serving.root == str(tmp_path / "data" / "deployments")


def test_service_autoscales_endpoints_the_way_the_chart_says(tmp_path, monkeypatch):
    """deployments.kubernetes.autoscaler reaches the serving backend, with its Prometheus."""
    endpoints = {
        "enabled": True,
        "autoscaler": "keda",
        "prometheusUrl": "http://prometheus.monitoring.svc:9090",
    }
    app = started_service(
        tmp_path, monkeypatch, rendered_data({"deployments": {"kubernetes": endpoints}})
    )
    serving = app.deployments.serving
    assert (serving.autoscaler, serving.prometheus_url) == (
        "keda",
        "http://prometheus.monitoring.svc:9090",
    )


def test_hibernation_on_kubernetes(tmp_path, monkeypatch):
    """Hibernation's settings reach the service; the service reaches users' servers
    through z2jh's proxy-public (its pod carries the label z2jh's proxy admits), and
    the kernels' state lands on the user's home volume: z2jh's per-user claim, which
    the chart leaves on (no Kubernetes API server here: the chart's objects and the
    service's config are checked as rendered)."""
    c = service_config(
        tmp_path, monkeypatch, {"hibernation": {"idleSeconds": 3600, "maxBytes": 5 * 10**9}}
    )
    hib = c.Hibernation
    assert hib.hibernate_idle_seconds == 3600 and hib.hibernate_max_bytes == 5 * 10**9
    assert hib.hibernate_for_others_seconds == 300
    assert hib.servers_url == "http://proxy-public"
    assert set(hib) <= set(Hibernation.class_trait_names())
    assert set(c.GpuLabService) <= set(GpuLabService.class_trait_names())

    z2jh = yaml.safe_load((CHART / "z2jh-values.yaml").read_text())
    storage = z2jh["singleuser"].get("storage") or {}
    assert storage.get("type", "dynamic") != "none"  # z2jh's default: a claim per user
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render({}, name="gpulab", namespace="hub", is_install=True)
    pod_labels = next(
        doc["spec"]["template"]["metadata"]["labels"]
        for path, text in out.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"] == "gpulab"
    )
    assert pod_labels["hub.jupyter.org/network-access-proxy-http"] == "true"


def test_the_service_uses_a_milvus_cluster_the_chart_names(tmp_path, monkeypatch):
    # Without one: the embedded engine (no uri, no token).
    c = service_config(tmp_path, monkeypatch, {})
    assert c.VectorSettings.vector_engine_uri == ""
    values = {
        "vectors": {
            "milvus": {
                "uri": "http://milvus.data.svc:19530",
                "tokenSecret": {"name": "milvus-token", "key": "token"},
            }
        }
    }
    monkeypatch.setenv("GPULAB_VECTOR_ENGINE_TOKEN", "root:Milvus")
    c = service_config(tmp_path, monkeypatch, values)
    assert c.VectorSettings.vector_engine_uri == "http://milvus.data.svc:19530"
    assert c.VectorSettings.vector_engine_token == "root:Milvus"
    # The token reaches the service's container from the Secret, never the ConfigMap.
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render({"jupyterhub": {"enabled": False}, **values}, name="gpulab")
    pod = yaml.safe_load(out["gpulab/templates/service-deployment.yaml"])["spec"]["template"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["GPULAB_VECTOR_ENGINE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "milvus-token",
        "key": "token",
    }
    assert "root:Milvus" not in out["gpulab/templates/configmap-service.yaml"]
