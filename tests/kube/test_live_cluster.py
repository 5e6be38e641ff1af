"""Against a live cluster: spawn a notebook pod, run a job, serve an endpoint, clean up.

Runs only when ``GPULAB_TEST_KUBECONFIG`` names a kubeconfig; otherwise every
test here is reported as skipped ("not run"). Each run works in a namespace
of its own (``gpulab-test-<random>``) and deletes it at the end.

Optional settings:

- ``GPULAB_TEST_IMAGE``: an image with Python 3 (default ``python:3.11-slim``);
- ``GPULAB_TEST_ENFORCEMENT`` + ``GPULAB_TEST_GPU_MODEL`` + ``GPULAB_TEST_GPU_MEMORY_MIB``:
  ask for a 1/4 GPU slice with that backend (default: no GPU, so any cluster works);
- ``GPULAB_TEST_KUEUE_QUEUE``: submit the job to that Kueue LocalQueue;
- ``GPULAB_TEST_STORAGE_CLASS`` + ``GPULAB_TEST_JOBS_ACCESS_MODE``: the claim the
  backend's jobs and models volume uses (default: the cluster's default class,
  ``ReadWriteOnce``, enough on a one-node cluster; use ``ReadWriteMany`` on more).

The backend's cases run gpulab's own objects (``gpulab.backend.kubernetes``)
with the image's command swapped, through ``pod_patch``, for a stand-in that
needs only Python: the default image has neither torch nor gpulab. The
stand-in keeps what the objects decide: each pod's index, ``is_host``, the
rendezvous name of index 0 and its port, the slice, the volumes.
"""

from __future__ import annotations

import os
import secrets

import pytest
from kube_helpers import validate_strict
from support.wait import wait_until_async

KUBECONFIG = os.environ.get("GPULAB_TEST_KUBECONFIG")
pytestmark = pytest.mark.skipif(
    not KUBECONFIG, reason="live-cluster suite not run: GPULAB_TEST_KUBECONFIG is not set"
)

IMAGE = os.environ.get("GPULAB_TEST_IMAGE", "python:3.11-slim")
BACKEND = os.environ.get("GPULAB_TEST_ENFORCEMENT", "")
TIMEOUT = float(os.environ.get("GPULAB_TEST_TIMEOUT", "300"))


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


def pod_template(name: str, command: list[str], labels: dict | None = None) -> dict:
    from gpulab.enforcement.kube import apply_to_pod

    _, patch = the_slice()
    template = {
        "metadata": {
            "labels": {"app.kubernetes.io/name": "gpulab-test", "test": name, **(labels or {})}
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": command,
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "256Mi"},
                    },
                }
            ]
        },
    }
    return apply_to_pod(template, patch)


async def wait_for(what: str, check, timeout: float = TIMEOUT, every: float = 2.0):
    """Poll ``check()`` until it returns something truthy (a state, not a delay)."""
    return await wait_until_async(check, what, timeout, every)


@pytest.fixture(scope="module")
async def api():
    from kubernetes_asyncio import client, config

    api_client = await config.new_client_from_config(config_file=KUBECONFIG)
    async with api_client:
        yield {
            "core": client.CoreV1Api(api_client),
            "batch": client.BatchV1Api(api_client),
            "apps": client.AppsV1Api(api_client),
        }


@pytest.fixture(scope="module")
async def namespace(api):
    name = f"gpulab-test-{secrets.token_hex(3)}"
    await api["core"].create_namespace(
        {"metadata": {"name": name, "labels": {"gpulab.io/test": "true"}}}
    )
    yield name
    await api["core"].delete_namespace(name)


async def test_spawn_notebook_pod(api, namespace):
    from kubespawner.objects import make_pod

    from gpulab.enforcement.kube.kueue import queue_patch
    from gpulab.spawner.kube import patch_pod_model

    milli, patch = the_slice()
    pod = make_pod(
        name="jupyter-gpulab-test",
        cmd=["python", "-m", "http.server", "8888"],
        port=8888,
        image=IMAGE,
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


async def test_job_runs_to_completion(api, namespace):
    from gpulab.enforcement.kube.kueue import queue_patch

    queueing = queue_patch("job", os.environ.get("GPULAB_TEST_KUEUE_QUEUE"), None)
    template = pod_template(
        "job", ["python", "-c", "import os; print('milli', os.environ['GPULAB_GPU_MILLI'])"]
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


async def test_endpoint_serves(api, namespace):
    labels = {"app.kubernetes.io/name": "gpulab-test", "test": "endpoint"}
    template = pod_template("endpoint", ["python", "-m", "http.server", "8080"])
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
        ep = await api["core"].read_namespaced_endpoints("gpulab-test-endpoint", namespace)
        return any(s.addresses for s in ep.subsets or [])

    await wait_for("the endpoint to have a ready address", ready)


# -- the Kubernetes backend's own objects ------------------------------------------------
# Index 0 listens where the rendezvous would be; index 1 connects to it by name.
RDZV_STAND_IN = """
import os, socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
host, port = args["rdzv-endpoint"].rsplit(":", 1)
is_host = args["rdzv-conf"].split(",")[0]
print("node", os.environ["PET_NODE_RANK"], is_host, "addr", args["local-addr"], flush=True)
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

JOBS_PVC = "gpulab-jobs"


def stand_in(
    command: list[str] | None = None,
    keep_args=("--rdzv-endpoint=", "--rdzv-conf=", "--local-addr="),
):
    """A pod patch: the slice, and the container's torchrun swapped for the stand-in."""
    from gpulab.enforcement.kube import apply_to_pod

    _, patch = the_slice()

    def apply(template):
        template = apply_to_pod(template, patch)
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


@pytest.fixture(scope="module")
async def jobs_pvc(api, namespace):
    claim = {
        "metadata": {"name": JOBS_PVC},
        "spec": {
            "accessModes": [os.environ.get("GPULAB_TEST_JOBS_ACCESS_MODE", "ReadWriteOnce")],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    if os.environ.get("GPULAB_TEST_STORAGE_CLASS"):
        claim["spec"]["storageClassName"] = os.environ["GPULAB_TEST_STORAGE_CLASS"]
    await api["core"].create_namespaced_persistent_volume_claim(namespace, claim)
    return JOBS_PVC


async def test_backend_job_pods_rendezvous_by_name(api, namespace, jobs_pvc, tmp_path):
    from gpulab.backend.kubernetes import JobOptions
    from gpulab.backend.kubernetes.backend import KubernetesBackend
    from gpulab.backend.spec import JobSpec
    from gpulab.enforcement.kube.kueue import queue_patch

    # The service's view of the job directory is a local folder here (it gets only
    # launch.json); the pods mount the claim at the same path, as in a real install.
    jobs_root = str(tmp_path)
    queue = queue_patch("job", os.environ.get("GPULAB_TEST_KUEUE_QUEUE"), None)["labels"]
    backend = KubernetesBackend(
        jobs_root,
        namespace=namespace,
        kubeconfig=KUBECONFIG,
        options=JobOptions(
            jobs_root=jobs_root, jobs_pvc=jobs_pvc, labels=queue, ttl_seconds_after_finished=600
        ),
        pod_patch_for=lambda spec, allocations: stand_in(),
    )
    spec = JobSpec(
        code="# stand-in",
        nodes=2,
        image=IMAGE,
        id=secrets.token_hex(4),
        user="tester",
        max_restarts=1,
        backend="kubernetes",
    )
    spec.validate()
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
        assert status.details["kind"] in ("Job", "JobSet")
    finally:
        await backend.cancel(spec)
        await backend.close()
    assert (await backend.poll(spec)).state == "failed"  # gone: nothing left to run


async def test_backend_endpoint_objects_serve(api, namespace, jobs_pvc):
    from gpulab.backend.kubernetes import make_deployment

    deployment, service = make_deployment(
        "live",
        image=IMAGE,
        model_dir="/models/live",
        models_pvc=jobs_pvc,
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
    try:

        async def ready():
            ep = await api["core"].read_namespaced_endpoints(name, namespace)
            return any(s.addresses for s in ep.subsets or [])

        await wait_for("the backend's endpoint to have a ready address", ready)
    finally:
        await api["apps"].delete_namespaced_deployment(
            name, namespace, propagation_policy="Foreground"
        )
        await api["core"].delete_namespaced_service(name, namespace)


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
