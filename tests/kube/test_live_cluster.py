"""Against a live cluster: the chart installed with helm, its RBAC, a notebook pod, a
two-node job, an endpoint, and what the cluster removes after a stop or a cancel.

By default the cluster is one the suite builds and starts (``live_kube`` in
conftest.py; tests/support/live_kube: Kubernetes v1.34.4 as plain processes, one
node in a network namespace, images made locally). ``GPULAB_TEST_KUBECONFIG`` points
the same tests at a site's own cluster instead. Each run works in a namespace of
its own (``gpulab-test-<random>``) and deletes it at the end.

Optional settings (a site's cluster):

- ``GPULAB_TEST_IMAGE``: an image with Python 3 (default ``python:3.11-slim``; on the
  suite's cluster a local image of this machine's Python);
- ``GPULAB_TEST_ENFORCEMENT`` + ``GPULAB_TEST_GPU_MODEL`` + ``GPULAB_TEST_GPU_MEMORY_MIB``:
  ask for a 1/4 GPU slice with that backend (default: no GPU, so any cluster works);
- ``GPULAB_TEST_KUEUE_QUEUE``: submit the job to that Kueue LocalQueue;
- ``GPULAB_TEST_STORAGE_CLASS``: the class of the chart's claims (default: the
  cluster's default class; the suite's cluster binds them to local volumes).

The backend's cases run gpulab's own objects (``gpulab.backend.kubernetes``), sent
with the chart's ServiceAccount (only what its Role grants), with the image's
command swapped, through ``pod_patch``, for a stand-in that needs only Python. The
stand-in keeps what the objects decide: each pod's index, ``is_host``, the
rendezvous name of index 0 (resolved by the cluster's DNS) and its port, the slice,
the volumes.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from kube_helpers import validate_strict
from support.wait import wait_until_async

# Slow: `make test` starts it first (tests/conftest.py orders files), beside the others.
pytestmark = pytest.mark.slow

BACKEND = os.environ.get("GPULAB_TEST_ENFORCEMENT", "")
TIMEOUT = float(os.environ.get("GPULAB_TEST_TIMEOUT", "300"))
CHART = Path(__file__).resolve().parents[2] / "helm" / "gpulab"
RELEASE = "gpulab"  # the chart's objects are named gpulab, gpulab-jobs, ...
JOBS_PVC = f"{RELEASE}-jobs"


def the_slice():
    from gpulab.enforcement.kube import GpuSlice, pod_slice_patch

    if not BACKEND:
        return 0, pod_slice_patch("hami", GpuSlice(0))
    s = GpuSlice.of(
        250,
        int(os.environ.get("GPULAB_TEST_GPU_MEMORY_MIB", "0")),
        os.environ.get("GPULAB_TEST_GPU_MODEL", ""),
    )
    return 250, pod_slice_patch(BACKEND, s)


def pod_template(name: str, image: str, command: list[str], labels: dict | None = None) -> dict:
    from gpulab.enforcement.kube import apply_to_pod

    _, patch = the_slice()
    template = {
        "metadata": {
            "labels": {"app.kubernetes.io/name": "gpulab-test", "test": name, **(labels or {})}
        },
        "spec": {
            # python as PID 1 ignores SIGTERM: without this a deleted pod takes its 30 s.
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": command,
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "256Mi"},
                    },
                }
            ],
        },
    }
    return apply_to_pod(template, patch)


async def wait_for(what: str, check, timeout: float = TIMEOUT, every: float = 1.0):
    """Poll ``check()`` until it returns something truthy (a state, not a delay)."""
    return await wait_until_async(check, what, timeout, every)


def kubeconfig_with_token(admin_kubeconfig: str, token: str, path: Path) -> str:
    """``admin_kubeconfig``'s cluster, as the bearer of ``token``."""
    config = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def image(live_kube):
    return live_kube.image


@pytest.fixture(scope="module")
async def api(live_kube):
    from kubernetes_asyncio import client, config

    api_client = await config.new_client_from_config(config_file=live_kube.admin_kubeconfig)
    async with api_client:
        yield {
            "client": api_client,
            "core": client.CoreV1Api(api_client),
            "batch": client.BatchV1Api(api_client),
            "apps": client.AppsV1Api(api_client),
            "net": client.NetworkingV1Api(api_client),
            "rbac": client.RbacAuthorizationV1Api(api_client),
        }


@pytest.fixture(scope="module")
async def namespace(api):
    name = f"gpulab-test-{secrets.token_hex(3)}"
    await api["core"].create_namespace(
        {"metadata": {"name": name, "labels": {"gpulab.io/test": "true"}}}
    )

    # A real cluster: a pod is refused until the namespace's "default" ServiceAccount
    # exists, which the controller-manager makes shortly after the namespace.
    async def default_account():
        accounts = await api["core"].list_namespaced_service_account(name)
        return any(a.metadata.name == "default" for a in accounts.items)

    await wait_for("the namespace's default ServiceAccount", default_account)
    yield name
    await api["core"].delete_namespace(name)


@pytest.fixture(scope="module")
def jobs_root(tmp_path_factory):
    """The service's jobs directory; on the suite's cluster the jobs claim's volume too
    (a hostPath volume of this folder), so the pods see what the service writes."""
    path = tmp_path_factory.mktemp("live-jobs")
    path.chmod(0o777)
    return str(path)


def helm_binary(live_kube) -> str | None:
    if getattr(live_kube, "bins", None) is not None:
        return str(live_kube.bins / "helm")
    return shutil.which("helm")


@pytest.fixture(scope="module")
async def release(live_kube, api, namespace, jobs_root, tmp_path_factory):
    """The chart installed with helm into the test namespace, as a site types it, and
    the ServiceAccount token its service pod would have (a kubeconfig of it)."""
    helm = helm_binary(live_kube)
    if helm is None:
        pytest.skip("no helm binary: put helm 3.8+ on PATH to install the chart")
    storage_class = os.environ.get("GPULAB_TEST_STORAGE_CLASS", "")
    if live_kube.local:
        # No provisioner on the suite's node: the claims bind to local volumes.
        await bind_local_volumes(api, namespace, {JOBS_PVC: jobs_root}, tmp_path_factory)
        storage_class = ""
    settings = [
        "service.image.pullPolicy=Never",  # no registry here: the service pod stays pending
        "jobs.storage.size=1Gi",
        "deployments.storage.size=1Gi",
        "service.persistence.size=1Gi",
    ]
    if storage_class:
        for part in ("jobs.storage", "deployments.storage", "service.persistence"):
            settings.append(f"{part}.storageClassName={storage_class}")
    argv = [helm, "install", RELEASE, str(CHART), "--namespace", namespace]
    argv += ["--kubeconfig", live_kube.admin_kubeconfig]
    for s in settings:
        argv += ["--set", s]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"helm install failed:\n{out.decode()}"
    token = await api["core"].create_namespaced_service_account_token(
        RELEASE, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    yield {
        "helm_output": out.decode(),
        "kubeconfig": kubeconfig_with_token(live_kube.admin_kubeconfig, token.status.token, path),
    }
    proc = await asyncio.create_subprocess_exec(
        helm,
        "uninstall",
        RELEASE,
        "--namespace",
        namespace,
        "--kubeconfig",
        live_kube.admin_kubeconfig,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.wait_for(proc.wait(), 120)


async def bind_local_volumes(api, namespace, claims: dict[str, str], tmp_path_factory):
    """A hostPath PersistentVolume reserved for each claim (``claimRef``): what a
    local-path provisioner would make, before the claim exists."""
    for claim in (JOBS_PVC, f"{RELEASE}-models", f"{RELEASE}-data"):
        path = claims.get(claim) or str(tmp_path_factory.mktemp(claim))
        Path(path).chmod(0o777)
        await api["core"].create_persistent_volume(
            {
                "metadata": {
                    "name": f"{namespace}-{claim}",
                    "labels": {"gpulab.io/test": "true"},
                },
                "spec": {
                    "capacity": {"storage": "1Ti"},
                    "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": path, "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )


@pytest.fixture(scope="module")
async def service_api(release):
    """The Kubernetes API as the chart's service account."""
    from kubernetes_asyncio import client, config

    api_client = await config.new_client_from_config(config_file=release["kubeconfig"])
    async with api_client:
        yield {
            "core": client.CoreV1Api(api_client),
            "batch": client.BatchV1Api(api_client),
            "rbac": client.RbacAuthorizationV1Api(api_client),
        }


async def test_api_server_version(api, live_kube, say):
    from kubernetes_asyncio import client

    version = await client.VersionApi(api["client"]).get_code()
    say(f"live cluster API server: {version.git_version} ({version.platform})")
    # A plain `go build` says v0.0.0-master, and helm then refuses the chart's kubeVersion.
    assert version.major == "1" and version.git_version.startswith("v1."), version
    if live_kube.local:
        assert version.git_version == "v1.34.4"


async def test_chart_installs_and_creates_its_objects(api, namespace, release):
    assert "STATUS: deployed" in release["helm_output"], release["helm_output"]
    deployment = await api["apps"].read_namespaced_deployment(RELEASE, namespace)
    account = deployment.spec.template.spec.service_account_name
    assert account == RELEASE
    role = await api["rbac"].read_namespaced_role(RELEASE, namespace)
    assert any("jobs" in r.resources for r in role.rules)

    seen = {}

    async def claims_bound():
        claims = await api["core"].list_namespaced_persistent_volume_claim(namespace)
        seen.update({c.metadata.name: c.status.phase for c in claims.items})
        return seen and set(seen.values()) == {"Bound"}

    try:
        await wait_for("the chart's claims to be bound", claims_bound, timeout=120)
    except AssertionError as e:
        volumes = await api["core"].list_persistent_volume()
        bound = {v.metadata.name: (v.status.phase, v.spec.claim_ref) for v in volumes.items}
        raise AssertionError(f"{e}: claims {seen}, volumes {bound}") from None
    assert JOBS_PVC in seen


async def test_service_account_is_denied_what_the_chart_does_not_grant(api, namespace, service_api):
    from kubernetes_asyncio.client.exceptions import ApiException

    core, rbac = service_api["core"], service_api["rbac"]
    # Granted: what the code calls (tests/kube/test_chart_rbac.py): its namespace's
    # pods listed, a job read (a 404 for one that is not there, not a 403), the nodes.
    await core.list_namespaced_pod(namespace)
    with pytest.raises(ApiException) as absent:
        await service_api["batch"].read_namespaced_job("no-such-job", namespace)
    assert absent.value.status == 404
    await core.list_node(limit=1)
    denied = {
        "secrets of another namespace": core.list_namespaced_secret("kube-system"),
        "a namespace": core.create_namespace({"metadata": {"name": f"{namespace}-x"}}),
        "a node's labels": core.patch_node("no-such-node", {"metadata": {"labels": {"a": "b"}}}),
        "a Role (escalation)": rbac.create_namespaced_role(
            namespace, {"metadata": {"name": "more"}, "rules": []}
        ),
        "exec into a pod": core.connect_post_namespaced_pod_exec(
            "any", namespace, command=["true"], stdout=True
        ),
        "jobs of another namespace": service_api["batch"].list_namespaced_job("default"),
        # Nothing it never reads: every namespace's pods, its own namespace's Secrets
        # (rendezvous secrets, endpoint tokens), ConfigMaps and claims, a pod's spec.
        "every namespace's pods": core.list_pod_for_all_namespaces(limit=1),
        "its namespace's secrets": core.list_namespaced_secret(namespace),
        "a secret of its namespace": core.read_namespaced_secret("gpulab-tokens", namespace),
        "its namespace's configmaps": core.list_namespaced_config_map(namespace),
        "its namespace's claims": core.list_namespaced_persistent_volume_claim(namespace),
        "a pod": core.read_namespaced_pod("any", namespace),
    }
    refused = {}
    for what, call in denied.items():
        try:
            await call
        except ApiException as e:
            refused[what] = e.status
        else:
            refused[what] = "allowed"
    assert refused == dict.fromkeys(denied, 403)


async def test_spawn_notebook_pod(api, namespace, image):
    from kubespawner.objects import make_pod

    from gpulab.enforcement.kube.kueue import queue_patch
    from gpulab.spawner.kube import patch_pod_model

    milli, patch = the_slice()
    pod = make_pod(
        name="jupyter-gpulab-test",
        cmd=["python", "-m", "http.server", "8888"],
        port=8888,
        image=image,
        env={**patch.env, "GPULAB_API_URL": "http://x"},
        labels={"app.kubernetes.io/name": "gpulab-test"},
    )
    patch_pod_model(pod, patch, queue_patch("server", notebook_priority_class=""))
    await api["core"].create_namespaced_pod(namespace, pod)

    async def running():
        p = await api["core"].read_namespaced_pod("jupyter-gpulab-test", namespace)
        assert p.status.phase not in ("Failed", "Succeeded"), p.status
        return p if p.status.phase == "Running" else None

    p = await wait_for("the notebook pod to run", running)
    env = {e.name: e.value for e in p.spec.containers[0].env}
    assert env["GPULAB_GPU_MILLI"] == str(milli)


async def test_job_runs_to_completion(api, namespace, image):
    from gpulab.enforcement.kube.kueue import queue_patch

    queueing = queue_patch("job", os.environ.get("GPULAB_TEST_KUEUE_QUEUE"), None)
    template = pod_template(
        "job", image, ["python", "-c", "import os; print('milli', os.environ['GPULAB_GPU_MILLI'])"]
    )
    template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gpulab-test-job", "labels": queueing["labels"]},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 600, "template": template},
    }
    validate_strict(job)
    await api["batch"].create_namespaced_job(namespace, job)

    async def finished():
        j = await api["batch"].read_namespaced_job_status("gpulab-test-job", namespace)
        assert not j.status.failed, j.status
        return j if j.status.succeeded else None

    await wait_for("the job to succeed", finished)
    pods = await api["core"].list_namespaced_pod(namespace, label_selector="test=job")
    log = await api["core"].read_namespaced_pod_log(pods.items[0].metadata.name, namespace)
    assert f"milli {the_slice()[0]}" in log


async def test_endpoint_serves(api, namespace, image):
    labels = {"app.kubernetes.io/name": "gpulab-test", "test": "endpoint"}
    template = pod_template("endpoint", image, ["python", "-m", "http.server", "8080"])
    template["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "name": "http"}]
    template["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": "http"},
        "periodSeconds": 2,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpulab-test-endpoint"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gpulab-test-endpoint"},
        "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    validate_strict(deployment)
    validate_strict(service)
    await api["apps"].create_namespaced_deployment(namespace, deployment)
    await api["core"].create_namespaced_service(namespace, service)

    async def ready():
        return await ready_addresses(api, namespace, "gpulab-test-endpoint")

    await wait_for("the endpoint to have a ready address", ready)


async def ready_addresses(api, namespace: str, service: str) -> list[str]:
    """The ready addresses behind ``service``, from its EndpointSlices. A real cluster
    makes them a moment after the Service (v1 Endpoints are deprecated since 1.33 and
    answer 404 until then)."""
    from kubernetes_asyncio import client

    slices = await client.DiscoveryV1Api(api["client"]).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return [
        a
        for s in slices.items
        for e in s.endpoints or []
        if e.conditions and e.conditions.ready
        for a in e.addresses
    ]


# -- the Kubernetes backend's own objects ------------------------------------------------
# Index 0 listens where the rendezvous would be; index 1 connects to it by name.
RDZV_STAND_IN = """
import os, socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
host, port = args["rdzv-endpoint"].rsplit(":", 1)
is_host = args["rdzv-conf"].split(",")[0]
print("node", os.environ["PET_NODE_RANK"], is_host, "addr", args["local-addr"], flush=True)
# Who the pod's code is, whatever the image says: its uid, groups, capabilities.
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print("uid", os.getuid(), "gid", os.getgid(), "caps", status["CapBnd"].strip(),
      "nnp", status.get("NoNewPrivs", "?").strip(), flush=True)
if is_host == "is_host=1":
    conn, _ = socket.create_server(("", int(port))).accept()
    print("peer", conn.recv(64).decode(), flush=True)
else:
    for _ in range(150):
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            time.sleep(2)
    else:
        sys.exit("cannot reach " + host)
    conn.sendall(os.environ["PET_NODE_RANK"].encode())
"""


def stand_in(
    command: list[str] | None = None,
    keep_args=("--rdzv-endpoint=", "--rdzv-conf=", "--local-addr="),
):
    """A pod patch: the slice, and the container's torchrun swapped for the stand-in."""
    from gpulab.enforcement.kube import apply_to_pod

    _, patch = the_slice()

    def apply(template):
        template = apply_to_pod(template, patch)
        template["spec"]["terminationGracePeriodSeconds"] = 1  # python as PID 1: no SIGTERM
        c = template["spec"]["containers"][0]
        if command is None:  # a job's node: keep the wrapper, run the stand-in under it
            kept = [a for a in c["args"] if a.startswith(keep_args)]
            c["args"] = ["python", "-c", RDZV_STAND_IN, *kept]
        else:  # an endpoint: a plain HTTP server where the model server would be
            c["command"] = command
            for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
                c.pop(probe, None)
            c["readinessProbe"] = {"tcpSocket": {"port": "http"}, "periodSeconds": 2}
        c["resources"] = {**c.get("resources", {}), "requests": {"cpu": "50m", "memory": "64Mi"}}
        c["resources"].setdefault("limits", {})["memory"] = "256Mi"
        return template

    return apply


def backend_of(release, namespace, jobs_root, **kw):
    """gpulab's Kubernetes backend as the chart's service runs it: its ServiceAccount."""
    from gpulab.backend.kubernetes import JobOptions
    from gpulab.backend.kubernetes.backend import KubernetesBackend
    from gpulab.enforcement.kube.kueue import queue_patch

    queue = queue_patch("job", os.environ.get("GPULAB_TEST_KUEUE_QUEUE"), None)["labels"]
    return KubernetesBackend(
        jobs_root,
        namespace=namespace,
        kubeconfig=release["kubeconfig"],
        options=JobOptions(
            jobs_root=jobs_root, jobs_pvc=JOBS_PVC, labels=queue, ttl_seconds_after_finished=600
        ),
        pod_patch_for=lambda spec, allocations: stand_in(),
        **kw,
    )


def job_spec(image: str):
    from gpulab.backend.spec import JobSpec

    spec = JobSpec(
        code="# stand-in",
        nodes=2,
        image=image,
        id=secrets.token_hex(4),
        user="tester",
        max_restarts=1,
        backend="kubernetes",
    )
    spec.validate()
    return spec


async def job_objects_left(api, namespace, job_id: str) -> dict[str, list[str]]:
    """What the cluster still holds of job ``job_id`` (by its label), kind by kind."""
    selector = f"gpulab.io/job-id={job_id}"
    found = {
        "pods": await api["core"].list_namespaced_pod(namespace, label_selector=selector),
        "jobs": await api["batch"].list_namespaced_job(namespace, label_selector=selector),
        "services": await api["core"].list_namespaced_service(namespace, label_selector=selector),
        "secrets": await api["core"].list_namespaced_secret(namespace, label_selector=selector),
        "networkpolicies": await api["net"].list_namespaced_network_policy(
            namespace, label_selector=selector
        ),
    }
    return {k: [o.metadata.name for o in v.items] for k, v in found.items() if v.items}


async def test_backend_job_pods_rendezvous_by_name(api, namespace, release, jobs_root, image):
    backend = backend_of(release, namespace, jobs_root)
    spec = job_spec(image)
    try:
        await backend.start(spec, [])

        async def done():
            status = await backend.poll(spec)
            assert status.state != "failed", status
            return status if status.state == "succeeded" else None

        status = await wait_for("the two-node job to succeed", done)
        pods = await api["core"].list_namespaced_pod(
            namespace, label_selector=f"gpulab.io/job-id={spec.id}"
        )
        logs = {}
        for p in pods.items:
            logs[p.metadata.annotations["batch.kubernetes.io/job-completion-index"]] = await api[
                "core"
            ].read_namespaced_pod_log(p.metadata.name, namespace)
        assert "node 0 is_host=1" in logs["0"] and "peer 1" in logs["0"], logs
        assert "node 1 is_host=0" in logs["1"], logs
        # The image's user is root; the pods run as 1000:100, no capabilities, no setuid.
        for log in logs.values():
            assert "uid 1000 gid 100 caps 0000000000000000 nnp 1" in log, logs
        assert status.details["kind"] in ("Job", "JobSet")
    finally:
        await backend.cancel(spec)
        await backend.close()
    assert (await backend.poll(spec)).state == "failed"  # gone: nothing left to run

    async def nothing_left():
        return not await job_objects_left(api, namespace, spec.id)

    await wait_for("the cancelled job's objects to be gone", nothing_left)


async def test_deleting_the_job_collects_what_it_owns(api, namespace, release, jobs_root, image):
    """What ``ttlSecondsAfterFinished`` (or a user's ``kubectl delete job``) does: the
    Job goes, and the garbage collector removes its pods, Secret, NetworkPolicy and
    Service by their owner references."""
    backend = backend_of(release, namespace, jobs_root)
    spec = job_spec(image)
    try:
        await backend.start(spec, [])
        left = await job_objects_left(api, namespace, spec.id)
        assert set(left) >= {"jobs", "services", "secrets", "networkpolicies"}, left
        await api["batch"].delete_namespaced_job(
            left["jobs"][0], namespace, propagation_policy="Background"
        )

        seen = {}

        async def collected():
            seen.clear()
            seen.update(await job_objects_left(api, namespace, spec.id))
            return not seen

        try:
            await wait_for("the job's objects to be collected", collected, timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}; left: {seen}") from None
    finally:
        await backend.cancel(spec)
        await backend.close()


async def test_backend_endpoint_objects_serve(api, namespace, live_kube, image):
    from gpulab.backend.kubernetes import make_deployment

    deployment, service = make_deployment(
        "live",
        image=image,
        model_dir="/models/live",
        models_pvc=f"{RELEASE}-models",
        models_root="/models",
        user="tester",
        replicas=1,
        port=8080,
        pod_patch=stand_in(["python", "-m", "http.server", "8080"]),
    )
    validate_strict(deployment)
    validate_strict(service)
    name = deployment["metadata"]["name"]
    await api["apps"].create_namespaced_deployment(namespace, deployment)
    await api["core"].create_namespaced_service(namespace, service)
    selector = ",".join(
        f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
    )
    try:

        async def ready():
            return await ready_addresses(api, namespace, name)

        [ip] = await wait_for("the backend's endpoint to have a ready address", ready)
        if live_kube.local:  # the host routes the pod range to the node
            with urllib.request.urlopen(f"http://{ip}:8080/", timeout=10) as r:
                assert r.status == 200
    finally:
        await api["apps"].delete_namespaced_deployment(name, namespace)
        await api["core"].delete_namespaced_service(name, namespace)

    async def replicas_gone():  # the ReplicaSet and its pods, by owner references
        pods = await api["core"].list_namespaced_pod(namespace, label_selector=selector)
        sets = await api["apps"].list_namespaced_replica_set(namespace, label_selector=selector)
        return not pods.items and not sets.items

    await wait_for("the endpoint's ReplicaSet and pods to be collected", replicas_gone)


async def test_cleanup_leaves_nothing(api, namespace):
    await api["apps"].delete_namespaced_deployment("gpulab-test-endpoint", namespace)
    await api["core"].delete_namespaced_service("gpulab-test-endpoint", namespace)
    await api["batch"].delete_namespaced_job(
        "gpulab-test-job", namespace, propagation_policy="Foreground"
    )
    await api["core"].delete_namespaced_pod(
        "jupyter-gpulab-test", namespace, grace_period_seconds=0
    )

    async def empty():
        pods = await api["core"].list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/name=gpulab-test"
        )
        return not pods.items

    await wait_for("every test pod to be gone", empty)


# -- a real two-node training job ----------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
TRAIN_ENV = {"STEPS": "20"}


def venv_patch(template):
    """The suite's image has Python but no torch and no gpulab: the node pods mount this
    machine's ``/usr`` and this checkout (its venv) read-only, at the same paths, as a
    notebook image would have them installed. Everything else is the backend's own."""
    from gpulab.enforcement.kube import apply_to_pod

    template = apply_to_pod(template, the_slice()[1])
    spec = template["spec"]
    spec["volumes"] += [
        {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
        {"name": "gpulab", "hostPath": {"path": str(REPO), "type": "Directory"}},
    ]
    c = spec["containers"][0]
    c["volumeMounts"] += [
        {"name": "host-usr", "mountPath": "/usr", "readOnly": True},
        {"name": "gpulab", "mountPath": str(REPO), "readOnly": True},
    ]
    venv_bin = str(REPO / ".venv" / "bin")
    c["env"] = [e for e in c["env"] if e["name"] != "PATH"]
    c["env"].append({"name": "PATH", "value": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"})
    c["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "4Gi"}}
    return template


async def test_two_pod_job_trains_to_the_local_weights(
    api, namespace, release, jobs_root, live_kube, image, tmp_path_factory
):
    """``%%train_distributed --nodes 2`` on Kubernetes: the backend's Indexed Job, two
    pods, gloo on CPU, rendezvous at index 0's DNS name; the weights equal one node's
    two processes on the local backend."""
    if not live_kube.local:
        pytest.skip("needs torch and gpulab in the image: the suite's own cluster mounts them")
    import sys

    import torch

    sys.path.insert(0, str(REPO / "tests" / "backend"))
    from cells import LINEAR
    from localrun import new_spec, prepare, wait, weights

    from gpulab.backend.local import LocalBackend

    local = LocalBackend(str(tmp_path_factory.mktemp("local-train") / "jobs"))
    single = new_spec(
        LINEAR, nodes=1, nproc_per_node=2, out="model", checkpoint_every=10, env=TRAIN_ENV
    )
    single_dir = prepare(local, single)
    await local.start(single, [])
    assert (await wait(local, single)).state == "succeeded"

    backend = backend_of(release, namespace, jobs_root)
    backend.pod_patch_for = lambda spec, allocations: venv_patch
    spec = new_spec(
        LINEAR,
        nodes=2,
        nproc_per_node=1,
        out="model",
        checkpoint_every=10,
        env=TRAIN_ENV,
        backend="kubernetes",
        image=image,
    )
    jd = prepare(backend, spec)
    # The service (uid 1000 in the chart) owns what it writes on the jobs claim; the
    # pods, 1000 too whatever the image says, write their logs and checkpoints there.
    owned_by_the_service(jd.path)
    try:
        await backend.start(spec, [])

        async def done():
            status = await backend.poll(spec)
            assert status.state != "failed", (status, jd.errors())
            return status if status.state == "succeeded" else None

        await wait_for("the two-pod training job to succeed", done)
    finally:
        await backend.cancel(spec)
        await backend.close()
    assert os.listdir(jd.p("checkpoints")), "checkpoints go to the job volume"
    a, b = weights(single_dir), weights(jd)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def owned_by_the_service(path: str, uid: int = 1000, gid: int = 1000) -> None:
    """``path`` and everything in it given to the service's uid, as the chart's service
    pod (uid 1000, fsGroup 1000) would have written it (this process is root)."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, gid)


# -- a notebook server through KubeSpawner ---------------------------------------------------
class SpawnUser:
    name = "alice"
    id = 7
    url = "/user/alice/"


async def test_kubespawner_starts_and_stops_a_server(
    live_kube, api, namespace, image, tmp_path, monkeypatch
):
    """gpulab's FractionalKubeSpawner as the hub runs it: the slice from the real gpulab
    service (in this process), the pod created by KubeSpawner and followed by its
    watch until it runs, then stopped and gone."""
    if not live_kube.local:
        pytest.skip("uses the suite's own cluster's credentials (a site's hub has its own)")
    from kubernetes_asyncio.config import kube_config

    # KubeSpawner reads the default kubeconfig; its host and CA make it load again.
    monkeypatch.setenv("KUBECONFIG", live_kube.admin_kubeconfig)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", live_kube.admin_kubeconfig)
    from kubespawner import KubeSpawner
    from kubespawner import clients as kubespawner_clients

    def forget_kubespawner_state():
        # KubeSpawner keeps its API settings and clients per process and event loop
        # (the suite's loop is one for the session): an earlier test's spawner, made
        # for an offline cluster, left a client this one would reuse, and the next
        # tests must not inherit this cluster's once it is gone.
        kubespawner_clients.load_config.cache_clear()
        kubespawner_clients._client_cache.clear()

    forget_kubespawner_state()
    try:
        await spawn_and_stop(live_kube, api, namespace, image, tmp_path)
    finally:
        await KubeSpawner._stop_all_reflectors()
        forget_kubespawner_state()


async def spawn_and_stop(live_kube, api, namespace, image, tmp_path):
    from support.service import running_service
    from traitlets.config import Config

    from gpulab.spawner.kube import FractionalKubeSpawner

    async with running_service(
        tmp_path / "svc", "c.GpuLabService.stop_work_on_exit = True\n", simulate=""
    ) as svc:
        c = Config()
        c.KubeSpawner.namespace = namespace
        c.KubeSpawner.image = image
        c.KubeSpawner.image_pull_policy = "Never"
        c.KubeSpawner.k8s_api_host = live_kube.server
        c.KubeSpawner.k8s_api_ssl_ca_cert = live_kube.pki.ca
        # A server that listens where KubeSpawner expects one (the image has no Jupyter;
        # IPv4: the pod network has no IPv6, where bind='' would listen).
        serve = "import http.server as h; h.test(h.SimpleHTTPRequestHandler, port=8888, bind="
        c.KubeSpawner.cmd = ["python", "-c", serve + "'0.0.0.0')"]
        c.KubeSpawner.start_timeout = 120
        c.FractionalKubeSpawner.gpulab_api_url = svc.api
        c.FractionalKubeSpawner.gpulab_api_token = svc.fake_hub.service_token
        c.FractionalKubeSpawner.enforcement = "hami"
        c.FractionalKubeSpawner.notebook_priority_class = ""
        spawner = FractionalKubeSpawner(config=c, user=SpawnUser(), _mock=True)
        spawner.api_token = "user-server-token"
        spawner.user_options = {"gpu_milli": 0}
        try:
            url = await asyncio.wait_for(spawner.start(), 180)
        except TimeoutError:
            events = await api["core"].list_namespaced_event(namespace)
            said = [(e.involved_object.name, e.reason, e.message) for e in events.items]
            raise AssertionError(f"the server did not start; events: {said}") from None
        pod = await api["core"].read_namespaced_pod(spawner.pod_name, namespace)
        assert pod.status.phase == "Running"
        assert url.endswith(":8888") and pod.status.pod_ip in url

        def answers():  # as the hub does: Running is not yet listening
            try:
                with urllib.request.urlopen(url + "/", timeout=5) as r:
                    return r.status
            except OSError:
                return None

        async def serving():
            return await asyncio.to_thread(answers)

        assert await wait_for("the server to answer", serving, timeout=60) == 200
        await asyncio.wait_for(spawner.stop(), 180)

        async def gone():
            pods = await api["core"].list_namespaced_pod(
                namespace, field_selector=f"metadata.name={spawner.pod_name}"
            )
            return not pods.items

        await wait_for("the server's pod to be gone", gone, timeout=60)


# -- a hub in pods, the chart's service in its pod, an endpoint through the hub --------------
async def run_helm(live_kube, *args: str) -> str:
    helm = helm_binary(live_kube)
    proc = await asyncio.create_subprocess_exec(
        helm,
        *args,
        "--kubeconfig",
        live_kube.admin_kubeconfig,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"helm {args[0]} failed:\n{out.decode()}"
    return out.decode()


async def pods_said(api, namespace: str) -> str:
    """Each pod's phase, its containers' states and the end of their logs (the
    previous run's, for a container that restarted): what a failed wait shows."""
    lines = []
    for p in (await api["core"].list_namespaced_pod(namespace)).items:
        for s in p.status.container_statuses or []:
            lines.append(
                f"{p.metadata.name}/{s.name} {p.status.phase} ready={s.ready} "
                f"restarts={s.restart_count} state={s.state} last={s.last_state}"
            )
            try:
                log = await api["core"].read_namespaced_pod_log(
                    p.metadata.name,
                    namespace,
                    container=s.name,
                    tail_lines=20,
                    previous=bool(s.restart_count),
                )
            except Exception as e:  # noqa: BLE001 - evidence only
                log = f"(no log: {e})"
            lines.append(log)
    return "\n".join(lines)


async def crash_looping(api, namespace: str) -> list[str]:
    """The containers of ``namespace`` that restarted three times: a crash loop, not a
    wait (under load the kubelet now and then replaces a new pod's sandbox once)."""
    pods = (await api["core"].list_namespaced_pod(namespace)).items
    return [
        f"{p.metadata.name}/{s.name}"
        for p in pods
        for s in p.status.container_statuses or []
        if s.restart_count >= 3
    ]


@pytest.fixture(scope="module", autouse=True)
async def hub_site_objects(live_kube, api, tmp_path_factory):
    """What z2jh and the gpulab chart make, in a namespace of their own: the hub and
    its proxy in pods (tests/support/live_kube/hub_site.py, with
    helm/gpulab/z2jh-values.yaml's hub settings) and the chart's service in its pod
    with only its ServiceAccount's rights. Made as the module starts, so the pods come
    up while the other tests run (``hub_site`` waits for them); what went wrong here
    fails only the tests that use them."""
    if not live_kube.local:
        yield None
        return
    from kubernetes_asyncio import utils
    from support.live_kube import hub_site as site

    ns = f"gpulab-hub-{secrets.token_hex(3)}"
    made = {"namespace": ns, "admin_token": secrets.token_hex(16), "error": None}
    await api["core"].create_namespace(
        {"metadata": {"name": ns, "labels": {"gpulab.io/test": "true"}}}
    )
    try:

        async def default_account():
            accounts = await api["core"].list_namespaced_service_account(ns)
            return any(a.metadata.name == "default" for a in accounts.items)

        await wait_for("the hub namespace's default ServiceAccount", default_account)
        await bind_local_volumes(api, ns, {}, tmp_path_factory)
        values = tmp_path_factory.mktemp("hub-site") / "values.yaml"
        values.write_text(yaml.safe_dump(site.service_values(live_kube.image)))
        await run_helm(
            live_kube, "install", RELEASE, str(CHART), "--namespace", ns, "-f", str(values)
        )
        for obj in site.objects(live_kube.image, secrets.token_hex(16), made["admin_token"]):
            await utils.create_from_dict(api["client"], obj, namespace=ns)
    except Exception as e:  # noqa: BLE001 - reported by the tests that use the site
        made["error"] = e
    yield made
    await api["core"].delete_namespace(ns)


@pytest.fixture(scope="module")
async def hub_site(hub_site_objects, api):
    """The site once its hub, proxy and service pods are ready, and the hub's public
    address (the proxy-public Service's cluster IP, which the host routes to the node)."""
    if hub_site_objects is None:
        pytest.skip("runs the hub from this machine's venv (a site's cluster has its own hub)")
    if hub_site_objects["error"] is not None:
        raise hub_site_objects["error"]
    ns = hub_site_objects["namespace"]

    async def all_available():
        crashed = await crash_looping(api, ns)
        assert not crashed, f"{crashed} crashed"
        for name in ("proxy", "hub", RELEASE):
            d = await api["apps"].read_namespaced_deployment_status(name, ns)
            if not d.status.available_replicas:
                return False
        return True

    try:
        await wait_for("the hub, proxy and service pods to be ready", all_available, timeout=180)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await pods_said(api, ns)}") from None
    proxy = await api["core"].read_namespaced_service("proxy-public", ns)
    return {
        **hub_site_objects,
        "url": f"http://{proxy.spec.cluster_ip}",
        "said": lambda: pods_said(api, ns),
    }


def hub_call(url: str, method: str = "GET", token: str | None = None, body: bytes | None = None):
    """(status, body) of one HTTP call, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def hub_user(hub_site, name: str) -> str:
    """A new hub user ``name`` and a token of theirs, made with the suite's admin token."""
    url, admin = hub_site["url"], hub_site["admin_token"]
    status, said = hub_call(f"{url}/hub/api/users/{name}", "POST", admin, b"{}")
    assert status == 201, (status, said)
    status, said = hub_call(f"{url}/hub/api/users/{name}/tokens", "POST", admin, b"{}")
    assert status == 201, (status, said)
    return json.loads(said)["token"]


async def test_endpoint_answers_through_the_hub(hub_site, api, tmp_path):
    """``%deploy`` on the site: alice's model goes to the gpulab service in its pod
    through the hub's proxy, becomes replica pods behind a Service, and answers
    her call at the hub's URL with her token; without a token, or with bob's, the
    call is refused. Stopping it removes its objects from the cluster."""
    import numpy as np
    import torch

    from gpulab.client import Client, Endpoint
    from gpulab.serving.export import export_model

    url, ns = hub_site["url"], hub_site["namespace"]

    alice_token = await asyncio.to_thread(hub_user, hub_site, "alice")
    bob_token = await asyncio.to_thread(hub_user, hub_site, "bob")
    model = torch.nn.Linear(4, 2).eval()
    export_model(model, torch.randn(2, 4), str(tmp_path / "model"), max_batch_size=8)
    alice = Client(f"{url}/services/gpulab/api/v1", token=alice_token, timeout=120)
    dep = await asyncio.to_thread(
        alice.create_deployment,
        str(tmp_path / "model"),
        {"name": "lin", "replicas": 1, "gpu_milli": 0},
    )
    name = f"gpulab-ep-d{dep['id']}"

    async def running():
        d = await asyncio.to_thread(alice.get_deployment, "lin")
        assert d["state"] not in ("failed", "stopped"), d
        return d if d["state"] == "running" else None

    try:
        await wait_for("alice's endpoint to be running", running, timeout=180)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await hub_site['said']()}") from None
    # Made by the service pod as the chart's ServiceAccount; the replicas get none.
    [service_pod] = (
        await api["core"].list_namespaced_pod(
            ns, label_selector="app.kubernetes.io/component=service"
        )
    ).items
    assert service_pod.spec.service_account_name == RELEASE
    deployment = await api["apps"].read_namespaced_deployment(name, ns)
    assert deployment.spec.template.spec.service_account_name in (None, "default")

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    endpoint = await asyncio.to_thread(Endpoint, "alice/lin", client=alice)
    out = await asyncio.to_thread(endpoint.infer, x)
    expected = model(torch.from_numpy(x)).detach().numpy()
    [answer] = out.values()
    np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)

    # One OIP v2 call at the hub's URL: alice's token answers; none, or bob's, is refused.
    call = f"{endpoint.url}/v2/models/lin/infer"
    tensor = {"shape": [3, 4], "datatype": "FP32", "data": x.ravel().tolist()}
    body = json.dumps({"inputs": [{"name": endpoint.inputs[0]["name"], **tensor}]}).encode()
    as_alice = await asyncio.to_thread(hub_call, call, "POST", alice_token, body)
    anonymous = await asyncio.to_thread(hub_call, call, "POST", None, body)
    as_bob = await asyncio.to_thread(hub_call, call, "POST", bob_token, body)
    assert as_alice[0] == 200 and b"outputs" in as_alice[1], as_alice
    assert anonymous[0] in (302, 401, 403) and b"outputs" not in anonymous[1], anonymous
    assert as_bob[0] in (403, 404) and b"outputs" not in as_bob[1], as_bob
    assert call.startswith(f"{url}/services/gpulab/endpoints/alice/lin"), call

    await asyncio.to_thread(alice.stop_deployment, "lin")
    selector = f"gpulab.io/endpoint=d{dep['id']}"

    async def gone():
        left = {
            "deployments": await api["apps"].list_namespaced_deployment(
                ns, label_selector=selector
            ),
            "services": await api["core"].list_namespaced_service(ns, label_selector=selector),
            "secrets": await api["core"].list_namespaced_secret(ns, label_selector=selector),
            "pods": await api["core"].list_namespaced_pod(ns, label_selector=selector),
        }
        return not any(v.items for v in left.values())

    await wait_for("the stopped endpoint's objects to be gone", gone, timeout=120)


async def test_user_spawns_through_the_hub(hub_site, api):
    """A server started through the hub in its pod: gpulab's FractionalKubeSpawner asks
    the service pod for the slice, KubeSpawner makes the pod with the hub's own
    ServiceAccount, the proxy routes ``/user/<name>/`` to it; stopped, the pod goes."""
    url, ns = hub_site["url"], hub_site["namespace"]
    token = await asyncio.to_thread(hub_user, hub_site, "carol")
    options = json.dumps({"gpu_milli": 0}).encode()
    status, said = await asyncio.to_thread(
        hub_call, f"{url}/hub/api/users/carol/server", "POST", token, options
    )
    assert status in (201, 202), (status, said)

    async def ready():
        status, said = await asyncio.to_thread(hub_call, f"{url}/hub/api/users/carol", "GET", token)
        assert status == 200, (status, said)
        server = json.loads(said)["servers"].get("")
        assert server is not None, "the hub gave up on the server"
        return server["ready"]

    try:
        await wait_for("carol's server to be ready", ready, timeout=150)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await hub_site['said']()}") from None
    status, said = await asyncio.to_thread(hub_call, f"{url}/user/carol/api/status", "GET", token)
    assert status == 200 and b"started" in said, (status, said)
    pod = await api["core"].read_namespaced_pod("jupyter-carol", ns)
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["GPULAB_GPU_MILLI"] == "0"
    # z2jh-values.yaml's hub.config: the notebook container never root, no capabilities.
    context = pod.spec.containers[0].security_context
    assert (context.run_as_user, context.run_as_non_root) == (1000, True), context
    assert context.allow_privilege_escalation is False and context.capabilities.drop == ["ALL"]
    assert context.seccomp_profile.type == "RuntimeDefault"

    status, said = await asyncio.to_thread(
        hub_call, f"{url}/hub/api/users/carol/server", "DELETE", token
    )
    assert status in (202, 204), (status, said)

    async def gone():
        pods = await api["core"].list_namespaced_pod(
            ns, field_selector="metadata.name=jupyter-carol"
        )
        return not pods.items

    await wait_for("carol's pod to be gone", gone, timeout=60)
