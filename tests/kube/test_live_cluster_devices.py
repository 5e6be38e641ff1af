"""On the suite's live cluster: DRA claims allocated by the real kube-scheduler.

gpulab's Kubernetes backend, under the ``dra`` enforcement backend, sends a job's
ResourceClaimTemplate (or a card's shared ResourceClaim) and its Indexed Job, as
the service does; the cluster's resourceclaim controller makes each pod's claim and
kube-scheduler v1.34.4 allocates it against the ResourceSlice a stand-in driver
publishes for the node (``support/live_kube/dra_driver.py``: two simulated H100
cards, MIG devices on the second, the attributes NVIDIA's driver publishes).

No kubelet plugin runs, so the pods' containers never start (the kubelet says the
driver is not registered): the tests assert what the scheduler decides, which is
what the claims are for: which device each claim gets, that the pod is bound to
the node, that one card is not given twice, that pods sharing a card share one
claim. Only on the suite's own cluster (a site's has its own driver and GPUs).
"""

from __future__ import annotations

import secrets

import pytest
from test_live_cluster import api, image, namespace, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

RESOURCE = ("resource.k8s.io", "v1")
JOBS_PVC = "gpulab-jobs"


@pytest.fixture(scope="module")
def driver(live_kube):
    if not live_kube.local:
        pytest.skip("the stand-in DRA driver publishes only on the suite's own cluster")
    from support.live_kube.dra_driver import StandInDriver

    d = StandInDriver(live_kube).publish()
    yield d
    d.remove()


@pytest.fixture(scope="module")
async def jobs_volume(api, namespace, tmp_path_factory):  # noqa: F811
    """The jobs claim every job pod mounts, bound to a local volume (no provisioner)."""
    path = tmp_path_factory.mktemp("dra-jobs")
    path.chmod(0o777)
    await api["core"].create_persistent_volume(
        {
            "metadata": {"name": f"{namespace}-jobs", "labels": {"gpulab.io/test": "true"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": JOBS_PVC},
            },
        }
    )
    await api["core"].create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": JOBS_PVC},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
            },
        },
    )
    yield str(path)
    await api["core"].delete_persistent_volume(f"{namespace}-jobs")


@pytest.fixture(scope="module")
async def inventory(driver, live_kube):
    """The GPUs as gpulab's inventory reads them: the driver's slices, from the real API."""
    from gpulab.backend.kubernetes.dra_inventory import (
        fetch_resource_slices,
        mig_devices,
        parse_resource_slices,
    )

    slices, _ = await fetch_resource_slices(live_kube.admin_kubeconfig)
    gpus, problem = parse_resource_slices(slices)
    return gpus, problem, mig_devices(slices)


async def test_the_inventory_reads_the_drivers_slices(driver, inventory):
    gpus, problem, migs = inventory
    assert problem is None
    assert [(g.uuid, g.node, g.memory_mib) for g in gpus] == [
        (g.uuid, driver.node, 81559) for g in driver.gpus
    ]
    assert migs == {driver.gpus[1].uuid: ["1g.10gb", "2g.20gb"]}


def dra_backend(live_kube, namespace, jobs_root, gpus, sharing: str):  # noqa: F811
    """gpulab's job backend as the service runs it under ``dra`` (admin credentials: the
    chart grants its ServiceAccount DRA rights only when installed with dra)."""
    from gpulab.backend.kubernetes.backend import KubernetesBackend

    return KubernetesBackend(
        jobs_root,
        namespace=namespace,
        jobs_pvc=JOBS_PVC,
        kubeconfig=live_kube.admin_kubeconfig,
        enforcement="dra",
        enforcement_options={"sharing": sharing},
        gpus=gpus,
    )


def job_spec(image: str, nodes: int, gpu_milli: int):
    from gpulab.backend.spec import JobSpec

    spec = JobSpec(
        code="# never runs: no kubelet plugin prepares the devices",
        nodes=nodes,
        gpu_milli=gpu_milli,
        image=image,
        id=secrets.token_hex(4),
        user="tester",
        max_restarts=0,
        backend="kubernetes",
    )
    spec.validate()
    return spec


async def pods_of(api, namespace, spec) -> list:  # noqa: F811
    found = await api["core"].list_namespaced_pod(
        namespace, label_selector=f"gpulab.io/job-id={spec.id}"
    )
    return found.items


async def claim(api, namespace, name: str) -> dict:  # noqa: F811
    from kubernetes_asyncio import client

    return await client.CustomObjectsApi(api["client"]).get_namespaced_custom_object(
        *RESOURCE, namespace, "resourceclaims", name
    )


async def scheduled(api, namespace, spec, count: int) -> list[tuple]:  # noqa: F811
    """Once ``count`` pods of ``spec`` are bound: ``[(pod, its claim)]``, in index order."""

    async def bound():
        pods = await pods_of(api, namespace, spec)
        for p in pods:
            unschedulable = [
                c.message
                for c in p.status.conditions or []
                if c.type == "PodScheduled" and c.reason == "Unschedulable"
            ]
            assert not unschedulable, unschedulable
        if len(pods) < count or not all(p.spec.node_name for p in pods):
            return None
        return sorted(pods, key=lambda p: p.metadata.name)

    pods = await wait_for(f"{count} pods of job {spec.id} to be bound", bound, timeout=120)
    out = []
    for p in pods:
        # A template's claim is the pod's own, named by the resourceclaim controller
        # in the pod's status; a shared card's claim is named in the pod's spec.
        [source] = p.spec.resource_claims
        name = source.resource_claim_name
        if name is None:
            [status] = p.status.resource_claim_statuses
            name = status.resource_claim_name
        out.append((p, await claim(api, namespace, name)))
    return out


def allocated(c: dict) -> list[tuple[str, str, str]]:
    results = c["status"]["allocation"]["devices"]["results"]
    return [(r["driver"], r["pool"], r["device"]) for r in results]


async def claims_gone(api, namespace, spec):  # noqa: F811
    async def gone():
        pods = await pods_of(api, namespace, spec)
        return not pods

    await wait_for(f"job {spec.id}'s pods (and their claims) to be gone", gone, timeout=120)


async def test_whole_cards_are_allocated_once_each(
    live_kube,
    api,
    namespace,
    driver,
    jobs_volume,
    inventory,
    image,  # noqa: F811
):
    """A two-node job of one card per node: each pod's claim (made from the job's
    template) gets a card of its own, and a third pod finds none left."""
    gpus, _, _ = inventory
    backend = dra_backend(live_kube, namespace, jobs_volume, gpus, "mig")
    two = job_spec(image, nodes=2, gpu_milli=1000)
    rows = [{"gpu_uuid": g.uuid, "milli": 1000, "node": g.node} for g in gpus]
    one = job_spec(image, nodes=1, gpu_milli=1000)
    try:
        await backend.start(two, rows)
        placed = await scheduled(api, namespace, two, 2)
        devices = sorted(d for _, c in placed for d in allocated(c))
        assert devices == [
            ("gpu.nvidia.com", driver.node, "gpu-0"),
            ("gpu.nvidia.com", driver.node, "gpu-1"),
        ]
        for pod, c in placed:
            assert pod.spec.node_name == driver.node
            assert [r["name"] for r in c["status"]["reservedFor"]] == [pod.metadata.name]
        # Both cards are held: the scheduler leaves a third whole-card pod pending.
        await backend.start(one, rows[:1])

        async def refused():
            for p in await pods_of(api, namespace, one):
                for cond in p.status.conditions or []:
                    if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                        return cond.message
            return None

        message = await wait_for("the third pod to be refused", refused, timeout=120)
        assert "cannot allocate all claims" in message, message
    finally:
        for spec in (two, one):
            await backend.cancel(spec, grace_s=0)
        await backend.close()
    await claims_gone(api, namespace, two)
    await claims_gone(api, namespace, one)


async def test_a_fraction_under_mig_gets_the_profile_that_holds_it(
    live_kube,
    api,
    namespace,
    driver,
    jobs_volume,
    inventory,
    image,  # noqa: F811
):
    gpus, _, _ = inventory
    backend = dra_backend(live_kube, namespace, jobs_volume, gpus, "mig")
    spec = job_spec(image, nodes=1, gpu_milli=250)
    try:
        await backend.start(spec, [{"gpu_uuid": gpus[1].uuid, "milli": 250, "node": driver.node}])
        [(pod, c)] = await scheduled(api, namespace, spec, 1)
        # A quarter of an 80 GB H100 snaps up to 2g.20gb (not the 1g.10gb beside it).
        assert allocated(c) == [("gpu.nvidia.com", driver.node, "gpu-1-mig-2g20gb-0")]
        env = {e.name: e.value for e in pod.spec.containers[0].env if e.value}
        assert env["GPULAB_MIG_PROFILE"] == "2g.20gb"
    finally:
        await backend.cancel(spec, grace_s=0)
        await backend.close()
    await claims_gone(api, namespace, spec)


async def test_jobs_sharing_a_card_under_mps_share_its_one_claim(
    live_kube,
    api,
    namespace,
    driver,
    jobs_volume,
    inventory,
    image,  # noqa: F811
):
    """Two jobs' quarters of one card: one ResourceClaim of that card, allocated once
    (its UUID pinned), reserved for both jobs' pods."""
    from gpulab.enforcement.kube.dra import shared_claim_name

    gpus, _, _ = inventory
    backend = dra_backend(live_kube, namespace, jobs_volume, gpus, "mps")
    card = gpus[0]
    specs = [job_spec(image, nodes=1, gpu_milli=250) for _ in range(2)]
    try:
        for spec in specs:
            await backend.start(spec, [{"gpu_uuid": card.uuid, "milli": 250, "node": card.node}])
        placed = [(await scheduled(api, namespace, spec, 1))[0] for spec in specs]
        name = shared_claim_name(card.uuid)
        assert {c["metadata"]["name"] for _, c in placed} == {name}
        shared = await claim(api, namespace, name)
        assert allocated(shared) == [("gpu.nvidia.com", driver.node, "gpu-0")]
        reserved = {r["name"] for r in shared["status"]["reservedFor"]}
        assert reserved == {pod.metadata.name for pod, _ in placed}
        # The sharing the driver would apply, passed through to it untouched.
        [config] = shared["status"]["allocation"]["devices"]["config"]
        assert config["opaque"]["parameters"]["sharing"] == {"strategy": "MPS"}
    finally:
        for spec in specs:
            await backend.cancel(spec, grace_s=0)
        await backend.close()
    for spec in specs:
        await claims_gone(api, namespace, spec)
