"""On the suite's live cluster: Kueue (built from its Go module) admits gpulab's jobs by
quota and preempts a lower class for a higher one, and gpulab's job status says so.

Kueue's manager runs as a process beside the control plane
(``support/live_kube/kueue.py``). The chart's Kueue objects are rendered with
``helm template`` (``kueue.enabled``, a ClusterQueue of 150m CPU that preempts
``LowerPriority`` work within it, the LocalQueue ``gpulab``, one PriorityClass and one
WorkloadPriorityClass per gpulab class) and created as helm would. gpulab's
Kubernetes backend, set as a site sets it (``queue = "gpulab"``,
``priority_class_prefix = "gpulab-"``), sends each job as the chart's ServiceAccount
with the chart's RBAC. Each job's one pod asks for 100m CPU, so one fits the quota.
"""

# ruff: noqa: F811 (the fixtures imported from the other live modules, named as parameters)
from __future__ import annotations

import asyncio
import subprocess
import urllib.error

import pytest
from test_live_cluster import api, image, namespace, wait_for  # noqa: F401 (fixtures)
from test_live_cluster_dra_netpol import (  # noqa: F401 (a fixture)
    JOBS_PVC,
    holding,
    job_spec,
    jobs_volume,
    pods_of,
)

pytestmark = pytest.mark.slow

KUEUE = ("kueue.x-k8s.io", "v1beta1")
FLAVOR = "gpulab-test-flavor"
VALUES = f"""
kueue:
  enabled: true
  clusterQueue:
    create: true
    preemption: {{withinClusterQueue: LowerPriority}}
    resourceGroups:
      - coveredResources: [cpu, memory]
        flavors:
          - name: {FLAVOR}
            resources:
              - {{name: cpu, nominalQuota: 150m}}
              - {{name: memory, nominalQuota: 2Gi}}
"""
#: Where each kind the chart renders here is created (admin, as helm would).
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "LocalQueue": "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues",
    "ClusterQueue": "/apis/kueue.x-k8s.io/v1beta1/clusterqueues",
    "WorkloadPriorityClass": "/apis/kueue.x-k8s.io/v1beta1/workloadpriorityclasses",
}


@pytest.fixture(scope="module")
def kueue(live_kube):
    if not live_kube.local:
        pytest.skip("Kueue is started only on the suite's own cluster")
    from support.live_kube.kueue import Kueue

    return Kueue(live_kube).start()


def active(obj: dict) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Active" and c["status"] == "True" for c in conds)


@pytest.fixture(scope="module")
async def site(kueue, live_kube, api, namespace, tmp_path_factory):
    """The chart's Kueue objects, PriorityClasses and RBAC (``helm template``), made in
    the cluster; a kubeconfig of the chart's ServiceAccount."""
    import yaml
    from test_live_cluster import CHART, kubeconfig_with_token

    values = tmp_path_factory.mktemp("kueue-values") / "values.yaml"
    values.write_text(VALUES)
    argv = [str(live_kube.bins / "helm"), "template", "gpulab", str(CHART)]
    argv += ["--namespace", namespace, "--values", str(values)]
    for t in ("rbac.yaml", "kueue.yaml", "priorityclass.yaml"):
        argv += ["--show-only", f"templates/{t}"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    flavors = "/apis/kueue.x-k8s.io/v1beta1/resourceflavors"
    flavor = {"apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}
    await asyncio.to_thread(live_kube.request, "POST", flavors, {**flavor, "spec": {}})
    for obj in yaml.safe_load_all(out):
        if obj:
            path = PATHS[obj["kind"]].format(ns=namespace)
            try:
                await asyncio.to_thread(live_kube.request, "POST", path, obj)
            except urllib.error.HTTPError as e:  # what the API server refused, and why
                raise AssertionError(f"{obj['kind']} refused: {e.read().decode()}") from None

    async def queues_active():
        cq = await asyncio.to_thread(live_kube.get, f"{PATHS['ClusterQueue']}/gpulab")
        lq = PATHS["LocalQueue"].format(ns=namespace) + "/gpulab"
        return active(cq) and active(await asyncio.to_thread(live_kube.get, lq))

    await wait_for("Kueue to take the ClusterQueue and LocalQueue as active", queues_active, 60)
    token = await api["core"].create_namespaced_service_account_token(
        "gpulab", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    path = tmp_path_factory.mktemp("kueue-sa") / "kubeconfig"
    return kubeconfig_with_token(live_kube.admin_kubeconfig, token.status.token, path)


@pytest.fixture
async def backend(site, api, namespace, jobs_volume):
    """gpulab's job backend set for Kueue as a site sets it; its pods hold 100m CPU.
    Every job it started is cancelled after the test."""
    from kubernetes_asyncio import client

    from gpulab.backend.kubernetes.backend import KubernetesBackend

    b = KubernetesBackend(
        jobs_volume,
        namespace=namespace,
        jobs_pvc=JOBS_PVC,
        kubeconfig=site,
        queue="gpulab",
        priority_class_prefix="gpulab-",
    )
    started = []

    def patch(spec, rows):
        def no_slice(template):  # no GPU: the backend has no slice patch
            template["spec"]["containers"][0].setdefault("resources", {})
            return template

        hold = holding(b.settings_pod_patch(spec, rows) or no_slice)

        def apply(template):
            template = hold(template)
            template["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100m"
            return template

        return apply

    b.pod_patch_for = patch
    original_start = b.start

    async def start(spec, rows):
        started.append(spec)
        await original_start(spec, rows)

    b.start = start
    yield b
    for spec in reversed(started):  # the waiting ones first: none is admitted on the way
        await b.cancel(spec, grace_s=0)
    await b.close()

    # The next test starts on a free quota: every Workload gone (each goes with its
    # Job, once the Job's pods are). A job queued while the quota was being freed
    # stayed pending here (Kueue v0.14.0 tried it once, before the freed quota was
    # counted, and not again).
    async def no_workloads():
        found = await client.CustomObjectsApi(api["client"]).list_namespaced_custom_object(
            *KUEUE, namespace, "workloads"
        )
        return not found["items"]

    await wait_for("the test's Workloads to be gone", no_workloads, 60)


def queued_job(image, priority_class="batch"):
    spec = job_spec(image, nodes=1, gpu_milli=0)
    spec.priority_class = priority_class
    return spec


async def running_pods(api, namespace, spec) -> list[str]:
    return [
        p.metadata.name for p in await pods_of(api, namespace, spec) if p.status.phase == "Running"
    ]


async def until_kueue(backend, spec, what: str, check, timeout: float = 60):
    """Poll gpulab's own status of ``spec`` until ``check(status.details["kueue"])``."""

    last = []

    async def state():
        status = await backend.poll(spec)
        assert status.state == "running", status
        last[:] = [status]
        return status if check(status.details["kueue"]) else None

    try:
        return await wait_for(what, state, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; gpulab's status: {last}") from None


async def test_a_job_within_quota_runs_and_one_over_it_waits_with_kueues_reason(
    backend, api, namespace, image
):
    first, second = queued_job(image), queued_job(image)
    await backend.start(first, [])
    status = await until_kueue(
        backend, first, "Kueue to admit the first job", lambda k: k["admitted"]
    )
    assert status.message == ""
    await wait_for("the admitted job's pod to run", lambda: running_pods(api, namespace, first), 90)

    await backend.start(second, [])
    # Kueue marks the workload Pending first and says what is short a moment later.
    status = await until_kueue(
        backend,
        second,
        "Kueue to hold the second job and say why",
        lambda k: k.get("reason") == "Pending" and "quota" in (k.get("message") or ""),
    )
    # Kueue's own words, through gpulab's status: what is short in which flavor.
    assert status.message.startswith("waiting in Kueue queue gpulab: "), status.message
    assert "insufficient unused quota for cpu" in status.message, status.message
    assert not status.details["kueue"]["admitted"]
    job = await api["batch"].read_namespaced_job(status.details["name"], namespace)
    assert job.spec.suspend is True
    assert await pods_of(api, namespace, second) == []


async def test_a_higher_class_preempts_a_lower_one_and_gpulab_says_so(
    backend, api, namespace, image
):
    from kubernetes_asyncio import client

    low, high = queued_job(image, "batch"), queued_job(image, "batch-high")
    await backend.start(low, [])
    await until_kueue(backend, low, "Kueue to admit the batch job", lambda k: k["admitted"])
    await wait_for("the batch job's pod to run", lambda: running_pods(api, namespace, low), 90)

    await backend.start(high, [])
    status = await until_kueue(
        backend, low, "Kueue to preempt the batch job", lambda k: k["preempted"]
    )
    assert status.message.startswith("preempted by Kueue in queue gpulab: "), status.message
    assert "due to prioritization in the ClusterQueue" in status.message, status.message
    await until_kueue(backend, high, "Kueue to admit the batch-high job", lambda k: k["admitted"])
    await wait_for(
        "the batch-high job's pod to run", lambda: running_pods(api, namespace, high), 90
    )

    async def low_gone():  # Kueue suspended it: the Job controller deletes its pod
        return not await pods_of(api, namespace, low)

    await wait_for("the preempted job's pod to be gone", low_gone, 60)
    assert (await backend.poll(low)).details["kueue"]["admitted"] is False

    # Kueue ordered them by the WorkloadPriorityClasses gpulab's labels named.
    workloads = await client.CustomObjectsApi(api["client"]).list_namespaced_custom_object(
        *KUEUE, namespace, "workloads"
    )
    priority = {
        w["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]: (
            w["spec"].get("priorityClassName"),
            w["spec"].get("priority"),
        )
        for w in workloads["items"]
    }
    jobs = {
        j.metadata.labels["gpulab.io/job-id"]: j.metadata.uid
        for j in (await api["batch"].list_namespaced_job(namespace)).items
    }
    assert priority[jobs[low.id]] == ("gpulab-batch", 100)
    assert priority[jobs[high.id]] == ("gpulab-batch-high", 200)
