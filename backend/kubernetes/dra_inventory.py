"""The cluster's GPUs as the DRA driver publishes them: ``resource.k8s.io/v1`` ResourceSlices.

With Dynamic Resource Allocation (the ``dra`` enforcement backend) the cards are
devices of the driver (NVIDIA's ``gpu.nvidia.com``), each with its real UUID,
``productName`` and ``memory`` capacity, listed per node in ResourceSlices
(``c.KubernetesInventory.source = "resourceslices"``). Pure parsing first; the
fetch (:func:`fetch_resource_slices`) loads credentials when called, never at import.
"""

from __future__ import annotations

import json
import re

from gpulab.scheduler.inventory import Gpu
from gpulab.scheduler.slices import noun

from .inventory import quantity

DRA_DRIVER = "gpu.nvidia.com"
_DEVICE_NUMBER = re.compile(r"^gpu-(\d+)$")


def _attribute(device: dict, name: str):
    """A device attribute's value (``{"string": ...}``, ``{"int": ...}``...) or None."""
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if value else None


def _memory_mib(device: dict) -> int:
    value = ((device.get("capacity") or {}).get("memory") or {}).get("value")
    try:
        return quantity(value) // 2**20 if value is not None else 0
    except ValueError:
        return 0


def _pool(s: dict) -> tuple[tuple, int]:
    """(the pool a slice belongs to, the pool's generation it was published in)."""
    pool = s["spec"].get("pool") or {}
    return (pool.get("name"), s["spec"].get("nodeName")), int(pool.get("generation") or 0)


def current_slices(slices: list[dict], driver: str = DRA_DRIVER) -> list[dict]:
    """``driver``'s ResourceSlices of each pool's newest generation (older ones are
    being replaced: the driver bumps a pool's generation when it republishes it)."""
    mine = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    newest: dict[tuple, int] = {}
    for key, generation in map(_pool, mine):
        newest[key] = max(newest.get(key, 0), generation)
    return [s for s in mine if _pool(s)[1] == newest[_pool(s)[0]]]


def parse_resource_slices(
    slices: list[dict], driver: str = DRA_DRIVER, nodes: set[str] | None = None
) -> tuple[list[Gpu], str | None]:
    """The cards ``driver`` publishes (device ``type`` ``gpu``), per node; MIG devices
    and VFIO devices are not cards (slices are counted on the card, :func:`mig_devices`
    says which are split). ``nodes``: only those nodes' (a label selector's)."""
    gpus: list[Gpu] = []
    for s in current_slices(slices, driver):
        node = s["spec"].get("nodeName")
        if not node or (nodes is not None and node not in nodes):
            continue
        cards = [d for d in s["spec"].get("devices") or [] if _attribute(d, "type") == "gpu"]
        for position, d in enumerate(cards):
            uuid = _attribute(d, "uuid")
            if not uuid:
                continue
            number = _DEVICE_NUMBER.match(d.get("name", ""))
            # Older drivers publish an index; newer ones name a card gpu-<minor>.
            index = _attribute(d, "index")
            if index is None:
                index = int(number.group(1)) if number else position
            model = str(_attribute(d, "productName") or "unknown GPU")
            gpus.append(Gpu(str(uuid), int(index), model, _memory_mib(d), node))
    gpus.sort(key=lambda g: (g.node, g.index))
    if not gpus:
        return [], (
            f"no ResourceSlice of the DRA driver {driver} lists a GPU (is NVIDIA's DRA "
            f"driver for GPUs installed, with its GPU resources enabled?)"
        )
    unknown = sorted({g.node for g in gpus if not g.memory_mib})
    if unknown:
        return [g for g in gpus if g.memory_mib], (
            f"GPU memory unknown on {noun(len(unknown), 'node')} {', '.join(unknown)} "
            f"(their devices carry no memory capacity); their GPUs are left out"
        )
    return gpus, None


def mig_devices(slices: list[dict], driver: str = DRA_DRIVER) -> dict[str, list[str]]:
    """``{card uuid: [MIG profiles published on it]}``: the cards that are MIG-enabled."""
    found: dict[str, list[str]] = {}
    for s in current_slices(slices, driver):
        for d in s["spec"].get("devices") or []:
            if _attribute(d, "type") == "mig" and _attribute(d, "parentUUID"):
                found.setdefault(str(_attribute(d, "parentUUID")), []).append(
                    str(_attribute(d, "profile") or "")
                )
    return {uuid: sorted(profiles) for uuid, profiles in found.items()}


async def fetch_resource_slices(
    kubeconfig: str | None = None, driver: str = DRA_DRIVER, label_selector: str = ""
) -> tuple[list[dict], set[str] | None]:
    """(``driver``'s ResourceSlices, the names of the nodes ``label_selector`` picks or
    None for every node), as plain dicts."""
    from kubernetes_asyncio import client

    async with await _api_client(kubeconfig) as api_client:
        found = await client.CustomObjectsApi(api_client).list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.driver={driver}"
        )
        nodes = None
        if label_selector:
            resp = await client.CoreV1Api(api_client).list_node(
                label_selector=label_selector, _preload_content=False
            )
            items = json.loads(await resp.read())["items"]
            nodes = {n["metadata"]["name"] for n in items}
        return found.get("items") or [], nodes


async def _api_client(kubeconfig: str | None):
    from kubernetes_asyncio import client, config

    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()
