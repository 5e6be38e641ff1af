"""The cluster's GPUs, read from its Node objects.

Pure parsing first (nodes and pods as the API returns them, camelCase
dicts), the fetch last and apart: :func:`load_cluster_inventory` is the only
function here that talks to a cluster, and it loads credentials when called,
never at import.

Where a node's GPUs come from, best first:

1. HAMi's registration annotation (``hami.io/node-nvidia-register``): every
   card with its real UUID, memory and health.
2. GPU Feature Discovery's labels (``nvidia.com/gpu.product``, ``.memory``,
   ``.count``): the cards, without UUIDs (gpulab names them
   ``k8s-<node>-gpu<i>``; the device plugin picks the physical card).
3. The node's allocatable ``nvidia.com/gpu`` alone: the count, model unknown.

MIG nodes are listed by their physical cards: slices are counted in
milli-GPU on cards, and the ``mig`` backend snaps each to a profile. Which
profiles are free right now is :func:`free_resources`.

With Dynamic Resource Allocation (the ``dra`` enforcement backend) the cards come
from the DRA driver's ResourceSlices instead (``c.KubernetesInventory.source =
"resourceslices"``): each card of NVIDIA's driver (``gpu.nvidia.com``) with its real
UUID, ``productName`` and ``memory`` capacity, per node (:mod:`.dra_inventory`).
"""

from __future__ import annotations

import json
import re

from traitlets import Enum, Unicode

from gpulab.scheduler.inventory import Gpu, Inventory, InventoryError
from gpulab.scheduler.slices import noun

from ..local_inventory import load_inventory

HAMI_REGISTER = "hami.io/node-nvidia-register"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_QUANTITY = re.compile(r"^(\d+)(m|k|Ki|M|Mi|G|Gi)?$")
_SUFFIX = {None: 1, "k": 1000, "Ki": 1024, "M": 1000**2, "Mi": 1024**2, "G": 1000**3, "Gi": 1024**3}


def quantity(value) -> int:
    """An integer Kubernetes quantity (``"4"``, ``"2k"``); milli-units round down."""
    if isinstance(value, int):
        return value
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"cannot read quantity {value!r}")
    n, suffix = int(m.group(1)), m.group(2)
    return n // 1000 if suffix == "m" else n * _SUFFIX[suffix]


def _model_of_product(product: str) -> str:
    # GFD labels spell the name with dashes; with MIG's single strategy it
    # appends the profile ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb").
    return re.sub(r"-MIG-\d+g\.\d+gb$", "", product)


def parse_hami_register(value: str, node: str) -> list[Gpu]:
    """HAMi's annotation: JSON (HAMi >= 2.4) or ``id,count,mem,cores,type,numa,health:``."""
    value = value.strip()
    devices: list[dict] = []
    if value.startswith("["):
        devices = json.loads(value)
    else:
        for item in filter(None, value.split(":")):
            fields = item.split(",")
            if len(fields) < 5:
                continue
            devices.append(
                {
                    "id": fields[0],
                    "devmem": int(fields[2]),
                    "type": fields[4],
                    "health": len(fields) < 7 or fields[6].lower() == "true",
                }
            )
    gpus = []
    for d in devices:
        if not d.get("health", True):
            continue
        model = str(d.get("type", ""))
        model = model[len("NVIDIA-") :] if model.startswith("NVIDIA-NVIDIA") else model
        gpus.append(Gpu(d["id"], len(gpus), model, int(d.get("devmem", 0)), node))
    return gpus


def parse_node(node: dict) -> list[Gpu]:
    """The GPUs of one Node object (see the module's docstring for the sources)."""
    meta = node.get("metadata") or {}
    name = meta["name"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(HAMI_REGISTER):
        return parse_hami_register(annotations[HAMI_REGISTER], name)
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    if GFD_COUNT in labels:
        count = int(labels[GFD_COUNT])
    elif GPU_RESOURCE in allocatable:
        # Sharing replicas (time-slicing, MPS without renaming) multiply the count.
        count = quantity(allocatable[GPU_RESOURCE]) // max(1, int(labels.get(GFD_REPLICAS, 1)))
    else:
        return []
    model = _model_of_product(labels.get(GFD_PRODUCT, "unknown GPU"))
    if GFD_MEMORY in labels:
        memory_mib = int(labels[GFD_MEMORY])
    else:
        gb = _GB.search(model)
        memory_mib = int(gb.group(1)) * 1024 if gb else 0
    return [Gpu(f"k8s-{name}-gpu{i}", i, model, memory_mib, name) for i in range(count)]


def parse_nodes(nodes: list[dict]) -> tuple[list[Gpu], str | None]:
    """Every schedulable node's GPUs; the reason when there are none (or some lack memory)."""
    gpus: list[Gpu] = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        gpus.extend(parse_node(node))
    if not gpus:
        return [], "no node in the cluster offers NVIDIA GPUs (nvidia.com/gpu or HAMi)"
    unknown = sorted({g.node for g in gpus if not g.memory_mib})
    if unknown:
        return [g for g in gpus if g.memory_mib], (
            f"GPU memory unknown on {noun(len(unknown), 'node')} {', '.join(unknown)} "
            f"(install GPU Feature "
            f"Discovery for the nvidia.com/gpu.memory label); their GPUs are left out"
        )
    return gpus, None


def _pod_requests(pod: dict) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for key, value in asked.items():
            if key.startswith(("nvidia.com/", "volcano.sh/")):
                total[key] = total.get(key, 0) + quantity(value)
    return total


def free_resources(nodes: list[dict], pods: list[dict]) -> dict[str, dict[str, int]]:
    """``{node: {resource: free}}`` for NVIDIA resources (MIG profiles included):
    allocatable minus what the node's running and pending pods hold."""
    free: dict[str, dict[str, int]] = {}
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        free[node["metadata"]["name"]] = {
            k: quantity(v)
            for k, v in allocatable.items()
            if k.startswith(("nvidia.com/", "volcano.sh/"))
        }
    for pod in pods:
        where = (pod.get("spec") or {}).get("nodeName")
        if where not in free or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for key, n in _pod_requests(pod).items():
            if key in free[where]:
                free[where][key] -= n
    return free


def free_mig_profiles(free: dict[str, dict[str, int]]) -> dict[str, int]:
    """``{"2g.20gb": 3, ...}``: free MIG devices of each profile across the cluster."""
    total: dict[str, int] = {}
    for resources in free.values():
        for key, n in resources.items():
            if key.startswith(MIG_RESOURCE_PREFIX) and n > 0:
                profile = key[len(MIG_RESOURCE_PREFIX) :]
                total[profile] = total.get(profile, 0) + n
    return total


async def fetch_nodes(kubeconfig: str | None = None, label_selector: str = "") -> list[dict]:
    """The cluster's Node objects as plain dicts (in-cluster credentials, else ``kubeconfig``)."""
    from kubernetes_asyncio import client, config

    if kubeconfig:
        api_client = await config.new_client_from_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        api_client = client.ApiClient()
    async with api_client:
        resp = await client.CoreV1Api(api_client).list_node(
            label_selector=label_selector, _preload_content=False
        )
        return json.loads(await resp.read())["items"]


async def load_cluster_inventory(
    kubeconfig: str | None = None, label_selector: str = ""
) -> tuple[list[Gpu], str | None]:
    """``(gpus, reason)`` like :func:`gpulab.scheduler.inventory.load_inventory`."""
    try:
        nodes = await fetch_nodes(kubeconfig, label_selector)
    except Exception as e:  # no credentials, API down, RBAC: say which
        return [], f"cannot list the cluster's nodes ({type(e).__name__}: {e})"
    return parse_nodes(nodes)


class KubernetesInventory(Inventory):
    """The cluster's GPU nodes (``c.InventorySettings.inventory_class = "kubernetes"``).

    A cluster that cannot be listed at start (no credentials, API down, RBAC) is
    an error, not an empty inventory: the service exits and the hub restarts it.
    """

    kubeconfig = Unicode(
        "",
        help="""Kubeconfig file to read the cluster's nodes with. Default: the pod's
        in-cluster credentials, else ~/.kube/config.

        c.KubernetesInventory.kubeconfig = "/etc/gpulab/kubeconfig"
        """,
    ).tag(config=True)

    label_selector = Unicode(
        "",
        help="""Label selector of the nodes whose GPUs are counted.

        c.KubernetesInventory.label_selector = "nvidia.com/gpu.present=true"
        """,
    ).tag(config=True)

    source = Enum(
        ["nodes", "resourceslices"],
        "nodes",
        help="""Where the GPUs are read: "nodes" (their device plugin's resources, GPU
        Feature Discovery's labels, HAMi's annotation) or "resourceslices" (the DRA
        driver's ResourceSlices, resource.k8s.io/v1: real UUIDs; what the "dra"
        enforcement backend needs).

        c.KubernetesInventory.source = "resourceslices"
        """,
    ).tag(config=True)

    dra_driver = Unicode(
        "gpu.nvidia.com",
        help="""The DRA driver whose ResourceSlices list the GPUs (source "resourceslices").

        c.KubernetesInventory.dra_driver = "gpu.nvidia.com"
        """,
    ).tag(config=True)

    def load(self) -> tuple[list[Gpu], str | None]:
        if self.simulate:
            self.log.info("simulate_gpus is set: using it instead of the cluster's nodes")
            return load_inventory(self.simulate, node=self.node or None)
        import asyncio

        if self.source == "resourceslices":
            from .dra_inventory import fetch_resource_slices, parse_resource_slices

            try:
                slices, nodes = asyncio.run(
                    fetch_resource_slices(
                        self.kubeconfig or None, self.dra_driver, self.label_selector
                    )
                )
            except Exception as e:
                # An API answer's status says it; its headers and body would drown it.
                status = getattr(e, "status", None)
                why = f"HTTP {status} {e.reason}" if status else f"{type(e).__name__}: {e}"
                raise InventoryError(
                    f'c.KubernetesInventory.source is "resourceslices" but the cluster\'s '
                    f"ResourceSlices cannot be listed ({why}); the cluster "
                    f"needs resource.k8s.io/v1 (Kubernetes 1.34) and the service's role the "
                    f"right to list resourceslices"
                ) from None
            return parse_resource_slices(slices, self.dra_driver, nodes)

        try:
            nodes = asyncio.run(fetch_nodes(self.kubeconfig or None, self.label_selector))
        except Exception as e:
            raise InventoryError(
                f'inventory_source is "kubernetes" but the cluster\'s nodes cannot be listed '
                f"({type(e).__name__}: {e}); run the service in the cluster (in-cluster "
                f"credentials) or set c.KubernetesInventory.kubeconfig"
            ) from None
        return parse_nodes(nodes)
