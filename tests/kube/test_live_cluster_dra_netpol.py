"""On the suite's live cluster: DRA claims allocated by the real kube-scheduler, and
gpulab's NetworkPolicies enforced by a real policy plugin.

**DRA.** gpulab's Kubernetes backend, under the ``dra`` enforcement backend, sends a
job's ResourceClaimTemplate (or a card's shared ResourceClaim) and its Indexed Job,
as the service does; the cluster's resourceclaim controller makes each pod's claim
and kube-scheduler v1.34.4 allocates it against the ResourceSlice a stand-in driver
publishes for the node (``support/live_kube/dra_driver.py``: two simulated H100
cards, MIG devices on the second, the attributes NVIDIA's driver publishes). The
tests assert what the scheduler decides: which device each claim gets, that the
pod is bound to the node, that one card is not given twice, that pods sharing a
card share one claim. The driver's stand-in kubelet plugin (``scripts/kube/
dra-plugin``) then prepares the devices, so the pods start: each says the slice's
environment it got.

**NetworkPolicies.** kube-router's firewall (``support/live_kube/firewall.py``) runs
on the node and enforces the policies the backend sends with a job and an
endpoint: a pod of another user reaches neither a job's rendezvous port nor an
endpoint's replica; the job's own pods and the router's pods do.

The backends send their objects as the chart's ServiceAccount, with only the RBAC
the chart renders for ``enforcement.backend=dra``. Only on the suite's own cluster
(a site's has its own driver, GPUs and plugin).
"""

# ruff: noqa: F811 (the fixtures imported from test_live_cluster, named as parameters)
from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from kube_helpers import endpoint_unit
from test_live_cluster import api, image, namespace, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

RESOURCE = ("resource.k8s.io", "v1")
JOBS_PVC = "gpulab-jobs"
#: How long a pod may stay unschedulable before a test says why and fails.
UNSCHEDULABLE_S = 30.0
MODELS_PVC = "gpulab-models"


@pytest.fixture(scope="module")
def driver(live_kube):
    if not live_kube.local:
        pytest.skip("the stand-in DRA driver publishes only on the suite's own cluster")
    from support.live_kube.dra_driver import StandInDriver

    d = StandInDriver(live_kube).publish().start_plugin()
    yield d
    d.remove()


@pytest.fixture(scope="module")
async def jobs_volume(api, namespace, tmp_path_factory):
    """The jobs and models claims the backend's pods mount, each bound to a local
    volume (no provisioner runs here) before any test makes a pod; the jobs folder."""
    folders = {}
    for claim in (JOBS_PVC, MODELS_PVC):
        path = folders[claim] = tmp_path_factory.mktemp(claim)
        path.chmod(0o777)
        await api["core"].create_persistent_volume(
            {
                "metadata": {"name": f"{namespace}-{claim}", "labels": {"gpulab.io/test": "true"}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )
        await api["core"].create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                },
            },
        )

    async def bound():
        claims = await api["core"].list_namespaced_persistent_volume_claim(namespace)
        phases = {c.metadata.name: c.status.phase for c in claims.items}
        return all(phases.get(claim) == "Bound" for claim in (JOBS_PVC, MODELS_PVC))

    # The volume controller binds a claim to its reserved volume on its own time (up
    # to its 15 s resync when it saw the claim before the volume); a pod made before
    # that is marked unschedulable, which the tests below take as a failure.
    await wait_for("the jobs and models claims to be bound", bound, timeout=120)
    yield str(folders[JOBS_PVC])
    for claim in (JOBS_PVC, MODELS_PVC):
        await api["core"].delete_persistent_volume(f"{namespace}-{claim}")


#: Where each kind the chart's RBAC template holds is created (admin, as helm would).
RBAC_PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


@pytest.fixture(scope="module")
async def service_account(live_kube, api, namespace, tmp_path_factory):
    """A kubeconfig of the chart's ServiceAccount with only the chart's RBAC, rendered
    for ``enforcement.backend=dra`` (``helm template --show-only templates/rbac.yaml``):
    the backends below send what the service sends, with the rights the chart gives."""
    import yaml
    from test_live_cluster import CHART, kubeconfig_with_token

    if not live_kube.local:
        pytest.skip("the stand-in driver and kube-router run only on the suite's own cluster")
    helm = str(live_kube.bins / "helm")
    argv = [helm, "template", "gpulab", str(CHART), "--namespace", namespace]
    argv += ["--set", "enforcement.backend=dra", "--show-only", "templates/rbac.yaml"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    made = []
    for obj in yaml.safe_load_all(out):
        if obj:
            path = RBAC_PATHS[obj["kind"]].format(ns=namespace)
            await asyncio.to_thread(live_kube.request, "POST", path, obj)
            made.append(f"{path}/{obj['metadata']['name']}")
    token = await api["core"].create_namespaced_service_account_token(
        "gpulab", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    path = tmp_path_factory.mktemp("chart-sa") / "kubeconfig"
    yield kubeconfig_with_token(live_kube.admin_kubeconfig, token.status.token, path)
    for path in made:
        if path.startswith("/apis/rbac.authorization.k8s.io/v1/cluster"):
            await asyncio.to_thread(live_kube.request, "DELETE", path)


@pytest.fixture(scope="module")
async def inventory(driver, service_account):
    """The GPUs as gpulab's inventory reads them: the driver's slices, from the real API."""
    from gpulab.backend.kubernetes.dra_inventory import (
        fetch_resource_slices,
        mig_devices,
        parse_resource_slices,
    )

    slices, _ = await fetch_resource_slices(service_account)
    gpus, problem = parse_resource_slices(slices)
    return gpus, problem, mig_devices(slices)


async def test_the_inventory_reads_the_drivers_slices(driver, inventory):
    gpus, problem, migs = inventory
    assert problem is None
    assert [(g.uuid, g.node, g.memory_mib) for g in gpus] == [
        (g.uuid, driver.node, 81559) for g in driver.gpus
    ]
    assert migs == {driver.gpus[1].uuid: ["1g.10gb", "2g.20gb"]}


# What a pod holding a slice runs here: it says what the slice put into its
# environment, then stays (the test reads the claims of running pods).
HOLD = """
import os, time
slice = [f"{k}={v}" for k, v in os.environ.items() if k.startswith(("GPULAB_GPU", "GPULAB_MIG"))]
print("slice", *sorted(slice), flush=True)
time.sleep(3600)
"""


def holding(slice_patch):
    """A pod patch: the backend's own (the claim, the slice's environment), then the
    container's command swapped for HOLD (the image has no torchrun, no model server)."""

    def apply(template):
        template = slice_patch(template)
        template["spec"]["terminationGracePeriodSeconds"] = 1  # python as PID 1: no SIGTERM
        c = template["spec"]["containers"][0]
        if c.get("args"):  # a job's node: the wrapper stays, HOLD runs under it
            c["args"] = ["python", "-c", HOLD]
        else:  # a replica
            c["command"], c["args"] = ["python", "-c", HOLD], []
        for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
            c.pop(probe, None)
        c["resources"]["requests"] = {"cpu": "50m", "memory": "64Mi"}
        c["resources"].setdefault("limits", {})["memory"] = "256Mi"
        return template

    return apply


def dra_backend(kubeconfig, namespace, jobs_root, gpus, sharing: str):
    """gpulab's job backend as the service runs it under ``dra``, its pods holding."""
    from gpulab.backend.kubernetes.backend import KubernetesBackend

    backend = KubernetesBackend(
        jobs_root,
        namespace=namespace,
        jobs_pvc=JOBS_PVC,
        kubeconfig=kubeconfig,
        enforcement="dra",
        enforcement_options={"sharing": sharing},
        gpus=gpus,
    )
    backend.pod_patch_for = lambda spec, rows: holding(backend.settings_pod_patch(spec, rows))
    return backend


async def started(api, namespace, pods) -> list[dict]:
    """Once every pod of ``pods`` runs (the kubelet had the plugin prepare its claim):
    the slice's environment each one printed."""

    async def running():
        seen = []
        for pod in pods:
            p = await api["core"].read_namespaced_pod(pod.metadata.name, namespace)
            assert p.status.phase in ("Pending", "Running"), p.status
            if p.status.phase != "Running":
                return None
            log = await api["core"].read_namespaced_pod_log(pod.metadata.name, namespace)
            if not log.startswith("slice"):
                return None
            seen.append(dict(kv.split("=", 1) for kv in log.split("\n")[0].split()[1:]))
        return seen

    names = ", ".join(p.metadata.name for p in pods)
    return await wait_for(
        f"pods {names} to start with their devices prepared", running, timeout=120
    )


def job_spec(image: str, nodes: int, gpu_milli: int):
    from gpulab.backend.spec import JobSpec

    spec = JobSpec(
        code="# never runs: the pods hold (HOLD)",
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


def selector_of(which) -> str:
    """A job's pods (its spec) or any pods (a label selector)."""
    return which if isinstance(which, str) else f"gpulab.io/job-id={which.id}"


async def pods_of(api, namespace, which) -> list:
    found = await api["core"].list_namespaced_pod(namespace, label_selector=selector_of(which))
    return found.items


def index_of(pod) -> str:
    return pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]


async def claim(api, namespace, name: str) -> dict:
    from kubernetes_asyncio import client

    return await client.CustomObjectsApi(api["client"]).get_namespaced_custom_object(
        *RESOURCE, namespace, "resourceclaims", name
    )


async def scheduled(api, namespace, which, count: int) -> list[tuple]:
    """Once ``count`` pods of ``which`` are bound: ``[(pod, its claim)]``, by name. A
    pod the scheduler keeps calling unschedulable for UNSCHEDULABLE_S fails at once
    (a moment's, e.g. while the last test's claims are freed, is retried by it)."""
    since: dict[str, float] = {}

    async def bound():
        pods = await pods_of(api, namespace, which)
        for p in pods:
            unschedulable = [
                c.message
                for c in p.status.conditions or []
                if c.type == "PodScheduled" and c.reason == "Unschedulable"
            ]
            first = since.setdefault(p.metadata.name, time.monotonic()) if unschedulable else None
            if not unschedulable:
                since.pop(p.metadata.name, None)
            assert first is None or time.monotonic() - first < UNSCHEDULABLE_S, unschedulable
        if len(pods) < count or not all(p.spec.node_name for p in pods):
            return None
        return sorted(pods, key=lambda p: p.metadata.name)

    pods = await wait_for(f"{count} pods of {selector_of(which)} to be bound", bound, timeout=120)
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


async def claims_gone(api, namespace, which):
    """Once ``which``'s pods are gone, and the claims made for them."""
    from kubernetes_asyncio import client

    custom = client.CustomObjectsApi(api["client"])

    async def gone():
        if await pods_of(api, namespace, which):
            return False
        claims = await custom.list_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")
        return not [c for c in claims["items"] if c["metadata"].get("ownerReferences")]

    what = f"the pods of {selector_of(which)} and their claims to be gone"
    await wait_for(what, gone, timeout=120)


async def test_whole_cards_are_allocated_once_each(
    service_account, api, namespace, driver, jobs_volume, inventory, image
):
    """A two-node job of one card per node: each pod's claim (made from the job's
    template) gets a card of its own, and a third pod finds none left."""
    gpus, _, _ = inventory
    backend = dra_backend(service_account, namespace, jobs_volume, gpus, "mig")
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
        envs = await started(api, namespace, [pod for pod, _ in placed])
        assert [e["GPULAB_GPU_MILLI"] for e in envs] == ["1000", "1000"]
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
    service_account, api, namespace, driver, jobs_volume, inventory, image
):
    gpus, _, _ = inventory
    backend = dra_backend(service_account, namespace, jobs_volume, gpus, "mig")
    spec = job_spec(image, nodes=1, gpu_milli=250)
    try:
        await backend.start(spec, [{"gpu_uuid": gpus[1].uuid, "milli": 250, "node": driver.node}])
        [(pod, c)] = await scheduled(api, namespace, spec, 1)
        # A quarter of an 80 GB H100 snaps up to 2g.20gb (not the 1g.10gb beside it).
        assert allocated(c) == [("gpu.nvidia.com", driver.node, "gpu-1-mig-2g20gb-0")]
        [env] = await started(api, namespace, [pod])
        assert (env["GPULAB_MIG_PROFILE"], env["GPULAB_GPU_MEMORY_MIB"]) == ("2g.20gb", "20480")
    finally:
        await backend.cancel(spec, grace_s=0)
        await backend.close()
    await claims_gone(api, namespace, spec)


async def test_jobs_sharing_a_card_under_mps_share_its_one_claim(
    service_account, api, namespace, driver, jobs_volume, inventory, image
):
    """Two jobs' quarters of one card: one ResourceClaim of that card, allocated once
    (its UUID pinned), reserved for both jobs' pods, and the card free again after."""
    from gpulab.enforcement.kube.dra import shared_claim_name

    gpus, _, _ = inventory
    backend = dra_backend(service_account, namespace, jobs_volume, gpus, "mps")
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
        # Both run on the one prepared device, each with its own MPS client limits.
        envs = await started(api, namespace, [pod for pod, _ in placed])
        assert [e["GPULAB_GPU_MILLI"] for e in envs] == ["250", "250"]
    finally:
        for spec in specs:
            await backend.cancel(spec, grace_s=0)
        await backend.close()
    for spec in specs:
        await claims_gone(api, namespace, spec)

    # The card's claim outlives the jobs (the backend deletes only templates); the
    # cluster frees the card once no pod holds the claim.
    async def released():
        status = (await claim(api, namespace, name)).get("status") or {}
        return not status.get("reservedFor") and not status.get("allocation")

    await wait_for("the shared claim to give the card back", released, timeout=60)


async def test_an_endpoints_replicas_get_a_card_each(
    service_account, api, namespace, driver, jobs_volume, inventory, image
):
    """An endpoint version of two whole-card replicas: the version's claim template
    gives each replica a claim of its own, and each claim a card of its own."""
    gpus, _, _ = inventory
    serving = serving_of(
        service_account, image, namespace, jobs_volume, enforcement="dra", gpus=gpus
    )
    serving.pod_patch_for = lambda dep, rows: holding(serving.settings_pod_patch(dep, rows))
    dep = endpoint_unit(id="d4a", replicas=2, gpu_milli=1000)
    serving.prepare(dep["id"])
    try:
        await serving.launch(dep, [{"gpu_uuid": g.uuid, "node": g.node} for g in gpus])
        selector = f"gpulab.io/endpoint={serving.k8s_name(dep)}"
        placed = await scheduled(api, namespace, selector, 2)
        assert sorted(d for _, c in placed for d in allocated(c)) == [
            ("gpu.nvidia.com", driver.node, "gpu-0"),
            ("gpu.nvidia.com", driver.node, "gpu-1"),
        ]
        envs = await started(api, namespace, [pod for pod, _ in placed])
        assert [e["GPULAB_GPU_MILLI"] for e in envs] == ["1000", "1000"]
    finally:
        await serving.stop(dep, wait_s=0)
        await serving.close()
    await claims_gone(api, namespace, selector)


def serving_of(kubeconfig, image, namespace, root, **settings):
    """gpulab's serving backend as the service runs it."""
    from gpulab.backend.kubernetes.serving import KubernetesServing

    return KubernetesServing(
        str(Path(root).parent / "deployments"),
        namespace=namespace,
        models_pvc=MODELS_PVC,
        image=image,
        kubeconfig=kubeconfig,
        **settings,
    )


# -- NetworkPolicies, enforced ---------------------------------------------------------------


@pytest.fixture(scope="module")
def firewall(live_kube):
    if not live_kube.local:
        pytest.skip("kube-router runs only on the suite's own cluster's node")
    from support.live_kube.firewall import Firewall, missing

    problem = missing()
    if problem:
        pytest.fail(f"NetworkPolicy enforcement cannot run: {problem}", pytrace=False)
    return Firewall(live_kube).start()


#: A pod a user's server would be (z2jh's labels for it), in the jobs' namespace.
USERS_POD = {"component": "singleuser-server", "hub.jupyter.org/username": "mallory"}

# Connects to host:port once (the target's firewall is in place before it runs), or
# until it gets through (a permitted pod's own address reaches kube-router's sets a
# moment after the pod starts).
PROBE = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(60 if until == "open" else 1):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("open", flush=True)
        break
    except OSError as e:
        print("blocked:", e, flush=True)
        if until == "open":
            time.sleep(1)
"""


async def probe(api, namespace, image, name: str, labels: dict, ip: str, port: int, until=""):
    """What a pod with ``labels`` gets when it connects to ``ip:port``: its last line."""
    pod = {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpulab-test", **labels}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", PROBE, ip, str(port), until],
                }
            ],
        },
    }
    await api["core"].create_namespaced_pod(namespace, pod)
    try:

        async def finished():
            p = await api["core"].read_namespaced_pod(name, namespace)
            return p.status.phase in ("Succeeded", "Failed") and p.status.phase

        assert await wait_for(f"probe {name} to finish", finished, timeout=120) == "Succeeded"
        log = await api["core"].read_namespaced_pod_log(name, namespace)
        return log.strip().splitlines()[-1]
    finally:
        await api["core"].delete_namespaced_pod(name, namespace, grace_period_seconds=0)


# Index 0 accepts connections for as long as it runs and prints each peer's rank;
# index 1 connects to it by the rendezvous name (the job's Service) and exits.
LISTENER = """
import os, socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
host, port = args["rdzv-endpoint"].rsplit(":", 1)
if args["rdzv-conf"].split(",")[0] == "is_host=1":
    server = socket.create_server(("", int(port)))
    print("listening", flush=True)
    while True:
        conn, _ = server.accept()
        print("peer", conn.recv(64).decode() or "(said nothing)", flush=True)
        conn.close()
for _ in range(120):
    try:
        socket.create_connection((host, int(port)), timeout=3).sendall(b"1")
        print("connected", flush=True)
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit("cannot reach " + host)
"""


async def test_a_jobs_pods_take_connections_only_from_each_other(
    service_account, api, namespace, firewall, jobs_volume, image
):
    from test_live_cluster import stand_in

    from gpulab.backend.kubernetes.backend import KubernetesBackend

    def listener(template):
        template = stand_in()(template)
        template["spec"]["containers"][0]["args"][2] = LISTENER
        return template

    backend = KubernetesBackend(
        jobs_volume,
        namespace=namespace,
        jobs_pvc=JOBS_PVC,
        kubeconfig=service_account,
        pod_patch_for=lambda spec, allocations: listener,
    )
    spec = job_spec(image, nodes=2, gpu_milli=0)
    try:
        await backend.start(spec, [])
        pods = {}

        async def index_1_connected():
            pods.update({index_of(p): p for p in await pods_of(api, namespace, spec)})
            assert pods.get("1") is None or pods["1"].status.phase != "Failed"
            return pods.get("1") and pods["1"].status.phase == "Succeeded"

        await wait_for("the job's index 1 to reach index 0", index_1_connected, timeout=180)
        host = pods["0"]
        port = int(host.spec.containers[0].ports[0].container_port)
        await wait_for(
            "kube-router to guard index 0",
            lambda: asyncio.to_thread(firewall.guards, namespace, host.metadata.name),
        )
        # Side by side, a user's pod and a pod of the job (its label): the second gets
        # through (index 0 listens all along), the first does not.
        ip, own = host.status.pod_ip, {"gpulab.io/job-id": spec.id}
        intruder, member = await asyncio.gather(
            probe(api, namespace, image, "intruder", USERS_POD, ip, port),
            probe(api, namespace, image, "own", own, ip, port, "open"),
        )
        assert intruder.startswith("blocked") and member == "open", (intruder, member)
        log = await api["core"].read_namespaced_pod_log(host.metadata.name, namespace)
        peers = [line for line in log.splitlines() if line.startswith("peer")]
        assert peers == ["peer 1", "peer (said nothing)"], log  # index 1, own; no intruder
    finally:
        await backend.cancel(spec, grace_s=0)
        await backend.close()


async def test_an_endpoints_replicas_take_calls_only_from_the_router(
    service_account, api, namespace, firewall, jobs_volume, image
):
    """The serving backend's objects (Secret, NetworkPolicy, Deployment, Service), a
    plain HTTP server in the replica: the router's pods reach it, a user's pod does
    not (calls go through the router, which checks the caller's token), nor does a
    pod wearing the router's labels in another namespace."""
    from test_live_cluster import ready_addresses, stand_in

    from gpulab.backend.kubernetes.isolation import ROUTER_POD_LABELS

    serving = serving_of(
        service_account,
        image,
        namespace,
        jobs_volume,
        pod_patch_for=lambda dep, rows: stand_in(["python", "-m", "http.server", "8080"]),
    )
    dep = endpoint_unit(id="f1e", replicas=1, gpu_milli=0)
    serving.prepare(dep["id"])
    name = serving.k8s_name(dep)
    elsewhere = f"{namespace}-users"
    await api["core"].create_namespace({"metadata": {"name": elsewhere}})
    try:
        await serving.launch(dep, [])

        async def can_hold_pods():  # its "default" ServiceAccount, made a moment after
            accounts = await api["core"].list_namespaced_service_account(elsewhere)
            return any(a.metadata.name == "default" for a in accounts.items)

        await wait_for(f"namespace {elsewhere}'s default ServiceAccount", can_hold_pods)

        async def ready():
            return await ready_addresses(api, namespace, serving.object_name(dep))

        [ip] = await wait_for("the replica to be ready (the kubelet's probe gets in)", ready)
        [replica] = await pods_of(api, namespace, f"gpulab.io/endpoint={name}")
        await wait_for(
            "kube-router to guard the replica",
            lambda: asyncio.to_thread(firewall.guards, namespace, replica.metadata.name),
        )
        router_labels, port = ROUTER_POD_LABELS, serving.port
        caller, spoof, router = await asyncio.gather(
            probe(api, namespace, image, "caller", USERS_POD, ip, port),
            probe(api, elsewhere, image, "spoof", router_labels, ip, port),
            probe(api, namespace, image, "router", router_labels, ip, port, "open"),
        )
        said = (caller, spoof, router)
        assert caller.startswith("blocked") and spoof.startswith("blocked"), said
        assert router == "open", said
    finally:
        await serving.stop(dep, wait_s=0)
        await serving.close()
        await api["core"].delete_namespace(elsewhere)


# Tries host:port every second for up to 90 s and says each change ("open", "blocked"),
# until it gets ``until``: a job pod's own firewall is set a moment after it starts.
REACH = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), sys.argv[3]
last = None
for _ in range(90):
    try:
        socket.create_connection((host, port), timeout=2).close()
        got = "open"
    except OSError:
        got = "blocked"
    if got != last:
        print(got, flush=True)
        last = got
    if got == until:
        break
    time.sleep(1)
"""


async def test_a_jobs_pods_reach_out_only_outside_the_blocked_ranges(
    service_account, api, namespace, firewall, jobs_volume, image
):
    """A job's egress: a server outside the job (a plain pod, no policy of its own) is
    reached by a job whose blocked ranges leave it out, and not by one whose blocked
    ranges hold it, as a site's private ranges would (the metadata server is blocked
    by default; nothing listens there here). The job's pods run as 1000, no capabilities."""
    from test_live_cluster import stand_in

    from gpulab.backend.kubernetes.backend import KubernetesBackend

    server = {
        "metadata": {"name": "outside", "labels": {"app.kubernetes.io/name": "gpulab-test"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "http",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-m", "http.server", "8080"],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }
    await api["core"].create_namespaced_pod(namespace, server)
    try:

        async def ready():
            p = await api["core"].read_namespaced_pod("outside", namespace)
            ok = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            return ok and p.status.pod_ip

        ip = await wait_for("the outside server to be ready", ready, timeout=120)
        said = {}
        for name, blocked, until in [
            ("allowed", ["169.254.169.254/32"], "open"),
            ("blocked", ["169.254.169.254/32", f"{ip}/32"], "blocked"),
        ]:

            def reach(template, until=until):
                template = stand_in()(template)
                args = ["python", "-c", REACH, ip, "8080", until]
                template["spec"]["containers"][0]["args"] = args
                return template

            backend = KubernetesBackend(
                jobs_volume,
                namespace=namespace,
                jobs_pvc=JOBS_PVC,
                kubeconfig=service_account,
                egress_blocked_cidrs=blocked,
                pod_patch_for=lambda spec, allocations, reach=reach: reach,
            )
            spec = job_spec(image, nodes=1, gpu_milli=0)
            try:
                await backend.start(spec, [])

                async def finished(spec=spec):
                    pods = await pods_of(api, namespace, spec)
                    done = [p for p in pods if p.status.phase in ("Succeeded", "Failed")]
                    return done and done[0]

                pod = await wait_for(f"the {name} job's pod to finish", finished, timeout=150)
                assert pod.status.phase == "Succeeded", pod.status
                assert pod.spec.security_context.run_as_user == 1000
                log = await api["core"].read_namespaced_pod_log(pod.metadata.name, namespace)
                said[name] = log.split()
            finally:
                await backend.cancel(spec, grace_s=0)
                await backend.close()
        # The first reaches it at once; the second is stopped once its firewall is in
        # place (it may get through in the moment before).
        assert said["allowed"] == ["open"], said
        assert said["blocked"][-1] == "blocked", said
    finally:
        await api["core"].delete_namespaced_pod("outside", namespace, grace_period_seconds=0)
