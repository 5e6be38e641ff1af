"""Who users' code is in gpulab's pods, whatever image it names; which images a job may
name; and the chart's own pods held the same way.

A job runs the image its user names, which may say ``USER root``, carry setuid
binaries or expect capabilities (``NET_RAW``...). Every job pod and every endpoint
replica gets a fixed non-root uid (1000:100 by default, the service's uid on the
shared claims), ``runAsNonRoot``, the runtime's default seccomp profile, no privilege
escalation and no capabilities: what Kubernetes' "restricted" Pod Security Standard
asks of a pod (:func:`restricted_violations` checks it, field by field, as the
PodSecurity admission plugin does). The live cluster runs such pods
(tests/kube/test_live_cluster.py: the stand-in prints uid 1000, no capabilities).
"""

from __future__ import annotations

import pytest
import yaml
from fake_apiserver import FakeApiServer
from kube_helpers import options, quarter, spec, validate_strict
from support.plugin_host import kubernetes_backend, kubernetes_serving
from support.service import running_service
from test_chart import HUB_OFF, UMBRELLA, Z2JH_VALUES, chart, render  # noqa: F401
from test_chart_config_files import rendered_data, service_config
from test_kube_spawner import kube, make_spawner, service  # noqa: F401 (fixtures)

from gpulab.backend.kubernetes import make_deployment, make_inference_service, make_job, make_jobset
from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.pod_security import PodSecurity, check_image
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.service.plugins import ConfigError

BACKENDS = ["hami", "mig", "mps", "timeslice", "nvml-cgroup", "kai", "volcano"]
POD_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "fsGroup": 1000,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
#: Volume types the "restricted" standard allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict) -> list[str]:
    """What keeps a pod spec from Kubernetes' "restricted" Pod Security Standard (v1.34's
    checks: baseline's and restricted's own), as the PodSecurity admission plugin reads it."""
    bad = []
    pod_ctx = pod.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            bad.append(host)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {volume['name']}: {sorted(kinds)}")
    if pod_ctx.get("runAsUser") == 0:
        bad.append("pod runAsUser 0")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        ctx = c.get("securityContext") or {}
        name = c["name"]
        if ctx.get("privileged"):
            bad.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities.add {caps['add']}")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser") == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                bad.append(f"{name}: hostPort")
    return bad


def pods_of(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


# -- job pods --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_pod_is_non_root_and_capability_less_whatever_its_slice(backend):
    """The pod template, after the slice's patch of each enforcement backend: the
    contexts stay, and the pod meets the "restricted" standard."""
    o = options(pod_patch=quarter(backend))
    for pod in (
        pods_of(make_job(spec(gpu_milli=250), o)),
        make_jobset(spec(gpu_milli=250), o)["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"
        ]["spec"],
    ):
        assert pod["securityContext"] == POD_CONTEXT
        assert [c["securityContext"] for c in pod["containers"]] == [CONTAINER_CONTEXT]
        assert restricted_violations(pod) == []


def test_an_image_that_says_root_still_runs_as_the_site_uid():
    """The uid is the pod's, not the image's: an image of USER root (or none) gets the
    site's; a site may name its own, or leave it to the image (still never root)."""
    root_image = spec(image="docker.io/library/python:3.11")  # USER root
    job = make_job(root_image, options(security=PodSecurity(2000, 2000, None)))
    assert pods_of(job)["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 2000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    validate_strict(job)
    image_own = pods_of(make_job(root_image, options(security=PodSecurity(None, None, None))))
    assert image_own["securityContext"] == {
        "runAsNonRoot": True,  # the kubelet refuses an image whose user is root
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    with pytest.raises(SpecError, match="run_as_user must not be 0"):
        PodSecurity(0)
    with pytest.raises(SpecError, match="run_as_group must be a uid/gid"):
        PodSecurity(1000, -1)


def test_the_settings_become_the_pods_contexts_and_refuse_root():
    backend = kubernetes_backend(
        {
            "namespace": "ml",
            "jobs_pvc": "gpulab-jobs",
            "run_as_user": 1234,
            "run_as_group": 1234,
            "fs_group": 4321,
        },
        "/srv/gpulab/jobs",
    )
    assert backend.options.security == PodSecurity(1234, 1234, 4321)
    [_, job] = backend.objects(spec(), [], jobset=False)
    context = pods_of(job)["securityContext"]
    assert (context["runAsUser"], context["fsGroup"]) == (1234, 4321)
    with pytest.raises(ConfigError, match="run_as_user must not be 0"):
        kubernetes_backend(
            {"namespace": "ml", "jobs_pvc": "gpulab-jobs", "run_as_user": 0}, "/srv/gpulab/jobs"
        )
    # By default: the service's uid and the Jupyter images' group.
    plain = kubernetes_backend({"namespace": "ml", "jobs_pvc": "gpulab-jobs"}, "/srv/gpulab/jobs")
    assert plain.options.security == PodSecurity(1000, 100, 1000)
    assert plain.options.egress_blocked_cidrs == ("169.254.169.254/32",)
    assert plain.options.allowed_images == ()


# -- which images a job may name ----------------------------------------------------------
ALLOWED = ("registry.example.org/gpulab-*", "ghcr.io/example/*")


@pytest.mark.parametrize(
    "image,ok",
    [
        ("registry.example.org/gpulab-singleuser:1", True),
        ("ghcr.io/example/team/train@sha256:" + "a" * 64, True),  # * crosses /
        ("registry.example.org/other:1", False),
        ("docker.io/library/python:3.11", False),
        ("evil.example/registry.example.org/gpulab-x:1", False),  # whole-name match
        ("REGISTRY.example.org/gpulab-x:1", False),  # case-sensitive
    ],
)
def test_a_job_image_must_match_the_allowed_patterns(image, ok):
    backend = kubernetes_backend(
        {"namespace": "ml", "jobs_pvc": "gpulab-jobs", "allowed_images": list(ALLOWED)},
        "/srv/gpulab/jobs",
    )
    job = spec(image=image)
    if ok:
        backend.check(job)
        make_job(job, backend.options)
        return
    message = (
        f"image '{image}' is not allowed on this site: a job's image must match one of "
        "'registry.example.org/gpulab-*', 'ghcr.io/example/*'"
    )
    with pytest.raises(SpecError, match="^" + message.replace("*", r"\*").replace(".", r"\.")):
        backend.check(job)
    with pytest.raises(SpecError, match="not allowed on this site"):
        make_job(job, backend.options)  # the builder checks too


def test_no_patterns_allow_any_image():
    check_image("anything.example/x:1", ())
    with pytest.raises(SpecError, match="glob patterns"):
        options(allowed_images=("",))


async def test_the_service_refuses_a_job_of_another_image_with_400(
    tmp_path, monkeypatch, offline_kubeconfig
):
    """jobs.kubernetes.allowedImages through the chart to the REST API: a 400 naming
    the patterns; nothing queued. An allowed image passes the same check."""
    data = rendered_data({"jobs": {"kubernetes": {"allowedImages": list(ALLOWED)}}})
    values = tmp_path / "service-values.json"
    values.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(values))
    async with running_service(tmp_path / "svc", data["gpulab_config.py"]) as svc:
        bob = svc.create_user("bob")
        body = {"code": "print(1)", "image": "docker.io/library/python:3.11"}
        r = await svc.request("POST", "/jobs", token=bob, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "image 'docker.io/library/python:3.11' is not allowed on this site" in error
        assert "'registry.example.org/gpulab-*', 'ghcr.io/example/*'" in error
        assert (await svc.request("GET", "/jobs", token=bob)).json() == []
        kube_backend = svc.app.jobs.backends["kubernetes"]
        assert kube_backend.options.allowed_images == ALLOWED
        allowed = JobSpec(
            code="print(1)",
            image="registry.example.org/gpulab-singleuser:1",
            id="f00dfeedbeef",
            backend="kubernetes",
        )
        allowed.validate()
        kube_backend.check(allowed)


# -- replicas -------------------------------------------------------------------------
def deployment_pod(**kw) -> dict:
    deployment, _ = make_deployment(
        "resnet",
        image="registry.example/gpulab:1",
        model_dir="/srv/gpulab/deployments/d1/model",
        models_pvc="gpulab-models",
        models_root="/srv/gpulab/deployments",
        user="ann",
        token_secret="gpulab-ep-resnet-token",
        **kw,
    )
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("tls", ["", "gpulab-replicas-tls"])
def test_a_replica_is_non_root_and_capability_less(tls):
    pod = deployment_pod(pod_patch=quarter("hami"), tls_secret=tls)
    assert pod["securityContext"] == POD_CONTEXT
    assert pod["containers"][0]["securityContext"] == CONTAINER_CONTEXT
    assert restricted_violations(pod) == []
    service = make_inference_service(
        "resnet",
        image="registry.example/gpulab:1",
        model_dir="/srv/gpulab/deployments/d1/model",
        models_pvc="gpulab-models",
        models_root="/srv/gpulab/deployments",
        user="ann",
    )
    predictor = service["spec"]["predictor"]
    assert predictor["securityContext"] == POD_CONTEXT
    assert predictor["containers"][0]["securityContext"] == CONTAINER_CONTEXT


def test_the_serving_settings_become_the_replicas_contexts(tmp_path):
    from traitlets.config import Config

    c = Config()  # None reaches a setting through the config (the chart's file sets them so)
    c.KubernetesServingSettings.fs_group = None
    serving = kubernetes_serving(
        {
            "namespace": "ml",
            "models_pvc": "gpulab-models",
            "image": "registry.example/gpulab:1",
            "run_as_user": 1500,
            "run_as_group": 1500,
            "egress_cidrs": ["10.20.0.0/16"],
        },
        str(tmp_path),
        config=c,
    )
    serving.pod_patch_for = None
    dep = {
        "id": "0a1b2c",
        "user": "ann",
        "replicas": 1,
        "max_batch_size": 8,
        "max_latency_ms": 2.0,
        "max_queue": 64,
    }
    serving.prepare(dep["id"])
    _, policy, deployment, _ = serving.objects(dep, [])
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1500,
        "runAsGroup": 1500,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert policy["spec"]["egress"][1] == {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]}
    validate_strict(policy)
    settings = {"namespace": "ml", "models_pvc": "m", "image": "i:1"}
    with pytest.raises(ConfigError, match="run_as_user must not be 0"):
        kubernetes_serving({**settings, "run_as_user": 0}, str(tmp_path))
    with pytest.raises(ConfigError, match="egress_cidrs: 'nowhere' is not a CIDR"):
        kubernetes_serving({**settings, "egress_cidrs": ["nowhere"]}, str(tmp_path))


# -- the chart --------------------------------------------------------------------------
def test_the_chart_hands_its_pod_security_to_the_service(tmp_path, monkeypatch):
    """jobs.kubernetes.podSecurity, allowedImages and egress.blockedCIDRs, and the
    replicas' podSecurity and egress, become the backends' settings; a value set to
    null (helm drops it) leaves that part to the image."""
    c = service_config(
        tmp_path,
        monkeypatch,
        {
            "jobs": {
                "kubernetes": {
                    "podSecurity": {"runAsUser": 1001, "runAsGroup": 1001, "fsGroup": None},
                    "allowedImages": list(ALLOWED),
                    "egress": {"blockedCIDRs": ["169.254.169.254/32", "10.0.0.0/8"]},
                }
            },
            "deployments": {
                "kubernetes": {
                    "podSecurity": {"runAsUser": None},
                    "egress": {"allowedCIDRs": ["10.20.0.0/16"]},
                }
            },
        },
    )
    jobs = c.KubernetesJobsSettings
    assert (jobs.run_as_user, jobs.run_as_group, jobs.fs_group) == (1001, 1001, None)
    assert jobs.allowed_images == list(ALLOWED)
    assert jobs.egress_blocked_cidrs == ["169.254.169.254/32", "10.0.0.0/8"]
    backend = kubernetes_backend(c.GpuLabService.kubernetes_jobs, str(tmp_path / "jobs"), config=c)
    assert backend.options.security == PodSecurity(1001, 1001, None)
    assert backend.options.egress_blocked_cidrs == ("169.254.169.254/32", "10.0.0.0/8")
    serving_settings = c.KubernetesServingSettings
    assert serving_settings.run_as_user is None and serving_settings.run_as_group == 100
    assert serving_settings.egress_cidrs == ["10.20.0.0/16"]
    serving = kubernetes_serving(
        c.GpuLabService.kubernetes_deployments, str(tmp_path / "deployments"), config=c
    )
    assert serving.pod_security() == PodSecurity(None, 100, 1000)
    # The chart's defaults: 1000:100, fsGroup 1000, the metadata server blocked.
    c = service_config(tmp_path, monkeypatch, {})
    jobs = c.KubernetesJobsSettings
    assert (jobs.run_as_user, jobs.run_as_group, jobs.fs_group) == (1000, 100, 1000)
    assert jobs.egress_blocked_cidrs == ["169.254.169.254/32"] and jobs.allowed_images == []
    assert c.KubernetesServingSettings.egress_cidrs == []


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"jobs": {"kubernetes": {"podSecurity": {"runAsUser": 0}}}}, "podSecurity/runAsUser"),
        ({"jobs": {"kubernetes": {"egress": {"blockedCIDRs": ["metadata"]}}}}, "blockedCIDRs/0"),
        ({"jobs": {"kubernetes": {"allowedImages": [""]}}}, "allowedImages/0"),
        ({"service": {"dbUrlSecret": {"name": "db", "key": ""}}}, "dbUrlSecret/key"),
    ],
)
def test_the_schema_refuses_bad_pod_security_values(chart, bad, message):  # noqa: F811
    import helm_python as helm

    with pytest.raises(helm.HelmError, match=message):
        chart.validate_schema({**HUB_OFF, **bad})


def test_the_chart_pods_meet_the_restricted_standard(chart):  # noqa: F811
    """The service's, MLflow's and the node agent's pods: non-root, seccomp, no
    capabilities. The agent reads NVML through the device nodes the NVIDIA runtime
    gives it and sysfs counters: no root, no host path."""
    objects = render(chart, {**HUB_OFF, "mlflow": {"enabled": True}})
    for name in ("Deployment/gpulab", "Deployment/gpulab-mlflow", "DaemonSet/gpulab-agent"):
        pod = objects[name]["spec"]["template"]["spec"]
        assert restricted_violations(pod) == [], name
    agent = objects["DaemonSet/gpulab-agent"]["spec"]["template"]["spec"]
    assert agent["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_database_password_comes_from_a_secret(chart):  # noqa: F811
    """service.dbUrlSecret: the service's and MLflow's pods read the URL from the Secret;
    the rendered chart holds no URL. dbUrl still works (plain text, as it says)."""
    values = {
        **HUB_OFF,
        "mlflow": {"enabled": True},
        "service": {"dbUrlSecret": {"name": "gpulab-db", "key": "url"}},
    }
    objects = render(chart, values)
    ref = {"secretKeyRef": {"name": "gpulab-db", "key": "url"}}
    for name in ("Deployment/gpulab", "Deployment/gpulab-mlflow"):
        container = objects[name]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["GPULAB_DB_URL"] == {"name": "GPULAB_DB_URL", "valueFrom": ref}, name
        validate_strict(objects[name])
    assert "postgresql" not in yaml.safe_dump(objects)
    plain = render(chart, {**HUB_OFF, "service": {"dbUrl": "postgresql://u:pw@db/gpulab"}})
    container = plain["Deployment/gpulab"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPULAB_DB_URL"] == {"name": "GPULAB_DB_URL", "value": "postgresql://u:pw@db/gpulab"}
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="service.dbUrl and service.dbUrlSecret.name"):
        render(chart, {**values, "service": {**values["service"], "dbUrl": "postgresql://x"}})
    # Without either: SQLite on the service's volume, no variable.
    default = render(chart, HUB_OFF)["Deployment/gpulab"]["spec"]["template"]["spec"]
    assert "GPULAB_DB_URL" not in {e["name"] for e in default["containers"][0]["env"]}


def test_the_notes_say_jobs_run_on_the_sites_backend(chart):  # noqa: F811
    out = chart.render(HUB_OFF, name="gpulab", namespace="gpulab", is_install=True)
    notes = next(text for path, text in out.items() if path.endswith("NOTES.txt"))
    assert "must say --backend kubernetes" not in notes
    assert 'jobs run on the site\'s backend, "kubernetes", when they name none' in notes
    assert "Their pods run as uid 1000, non-root, with no capabilities" in notes


# -- notebooks --------------------------------------------------------------------------
NOTEBOOK_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_z2jh_values_hold_notebook_containers():
    """z2jh-values.yaml (and the umbrella's copy) give KubeSpawner the notebook
    container's security context, a trait of the installed KubeSpawner."""
    from kubespawner import KubeSpawner

    config = Z2JH_VALUES["hub"]["config"]["KubeSpawner"]
    assert config["container_security_context"] == NOTEBOOK_CONTEXT
    assert set(config) <= set(KubeSpawner.class_trait_names(config=True))
    umbrella = yaml.safe_load((UMBRELLA / "values.yaml").read_text())
    assert umbrella["jupyterhub"]["hub"]["config"] == Z2JH_VALUES["hub"]["config"]


async def test_a_notebook_pod_gets_the_context(service, kube):  # noqa: F811
    """What KubeSpawner makes of it with z2jh's singleuser.uid (1000): the uid, and
    the context, on the notebook container."""
    spawner = make_spawner(service, "hami")
    spawner.uid = 1000
    spawner.container_security_context = Z2JH_VALUES["hub"]["config"]["KubeSpawner"][
        "container_security_context"
    ]
    spawner.user_options = {"gpu_milli": 250}
    await spawner.start()
    pod = kube.pods[-1]
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "runAsUser": 1000,
        **NOTEBOOK_CONTEXT,
    }
    validate_strict(pod)


async def test_the_backend_sends_the_contexts(tmp_path):
    """What reaches the API server: the Job's pods carry the contexts."""
    server = await FakeApiServer().start()
    backend = KubernetesBackend(
        str(tmp_path / "jobs"),
        namespace="gpulab",
        jobs_pvc="gpulab-jobs",
        kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"),
        pod_patch_for=None,
    )
    try:
        s = spec(image="docker.io/library/python:3.11")
        await backend.start(s, [])
        job = server.get("/apis/batch/v1/namespaces/gpulab/jobs", "gpulab-a1b2c3d4e5f6")
        assert pods_of(job)["securityContext"] == POD_CONTEXT
        assert restricted_violations(pods_of(job)) == []
    finally:
        await backend.close()
        await server.stop()
