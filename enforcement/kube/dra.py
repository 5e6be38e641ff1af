"""DRA: the slice as a ResourceClaim against NVIDIA's DRA driver for GPUs.

Kubernetes 1.34 made Dynamic Resource Allocation GA (``resource.k8s.io/v1``). A
pod asks for devices through a ResourceClaim (or a ResourceClaimTemplate, from
which each pod gets a claim of its own) that names a DeviceClass of the driver
and, with CEL selectors, which device; it lists the claim in
``spec.resourceClaims`` and each container names it in ``resources.claims``.
No extended resource (``nvidia.com/gpu``) is asked for.

NVIDIA's driver (``k8s-dra-driver-gpu``) publishes every card as a device of
DeviceClass ``gpu.nvidia.com`` and every MIG device as one of ``mig.nvidia.com``,
with attributes (``uuid``, ``productName``, ``profile``, ``parentUUID``) and
capacity ``memory`` in its ResourceSlices. The ``sharing`` option says how a
fraction of a card is held:

- ``mig`` (default): a MIG device of the smallest profile that holds the slice
  (:mod:`.mig_profiles`, as the ``mig`` backend snaps), on the card the ledger
  chose. The hardware isolates it; the claim is the pod's own.
- ``mps``: the card shared through the driver's MPS control daemon
  (``GpuConfig`` ``sharing.strategy: MPS``); each pod's client limits
  (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
  come from its slice.
- ``timeslicing``: the card taken in turns (``strategy: TimeSlicing``); PyTorch's
  allocator is capped to the slice's share, as on the ``timeslice`` backend.

DRA allocates a device to one claim, so the pods sharing a card under ``mps``
or ``timeslicing`` all reference one claim of that card (:func:`shared_claim_name`);
the driver applies the sharing to every pod of that claim. Whole cards are a
claim of the pod's own of ``count`` cards of class ``gpu.nvidia.com``.

Where the slice names its cards (the ledger's UUIDs, read from ResourceSlices),
a CEL selector pins them; else it pins the card's model (``productName``).
"""

from __future__ import annotations

import json
from dataclasses import replace

from .base import (
    DeviceClaim,
    EnforcementError,
    GpuSlice,
    SlicePatch,
    capped_env,
    placement,
    slice_env,
)
from .mig_profiles import MIG_PROFILES, snap

NAME = "dra"
DEFAULTS = {
    "sharing": "mig",
    "driver": "gpu.nvidia.com",
    "gpu_class": "gpu.nvidia.com",
    "mig_class": "mig.nvidia.com",
    "profiles": None,
    "time_slice_interval": "Default",
}
SHARING = ("mig", "mps", "timeslicing")
INTERVALS = ("Default", "Short", "Medium", "Long")
API_VERSION = "resource.k8s.io/v1"
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
#: The name of the claim in the pod (``spec.resourceClaims``, ``resources.claims``).
POD_CLAIM = "gpu"
#: The request's name inside the claim.
REQUEST = "gpu"


def check(options: dict) -> None:
    if options["sharing"] not in SHARING:
        raise EnforcementError(
            f"the dra backend's sharing {options['sharing']!r} is not one of "
            f'{", ".join(SHARING)}; e.g. enforcement_options = {{"sharing": "mps"}}'
        )
    if options["time_slice_interval"] not in INTERVALS:
        raise EnforcementError(
            f"time_slice_interval {options['time_slice_interval']!r} is not one of "
            f"{', '.join(INTERVALS)} (the driver's TimeSlicingConfig intervals)"
        )


def real_uuids(s: GpuSlice) -> list[str]:
    """The slice's cards as the driver names them (``GPU-…``); none for other names."""
    return [u for u in dict.fromkeys(s.gpu_uuids) if u.startswith("GPU-")]


def shared_claim_name(uuid: str) -> str:
    """The claim every pod sharing card ``uuid`` references: ``gpulab-gpu-<uuid>``."""
    return "gpulab-gpu-" + uuid.lower().removeprefix("gpu-")


def _attr(options: dict, name: str) -> str:
    return f"device.attributes[{json.dumps(options['driver'])}].{name}"


def _cel(expression: str) -> dict:
    return {"cel": {"expression": expression}}


def _pin(s: GpuSlice, options: dict, uuid_attr: str = "uuid") -> list[dict]:
    """Selectors holding the request to the slice's cards, else to their model."""
    uuids = real_uuids(s)
    if uuids:
        if len(uuids) == 1:
            return [_cel(f"{_attr(options, uuid_attr)} == {json.dumps(uuids[0])}")]
        return [_cel(f"{_attr(options, uuid_attr)} in {json.dumps(uuids)}")]
    if s.gpu_model:
        return [_cel(f"{_attr(options, 'productName')} == {json.dumps(s.gpu_model)}")]
    return []


def _exactly(device_class: str, count: int, selectors: list[dict]) -> dict:
    exactly: dict = {"deviceClassName": device_class, "allocationMode": "ExactCount"}
    exactly["count"] = count
    if selectors:
        exactly["selectors"] = selectors
    return exactly


def _spec(exactly: dict, parameters: dict | None = None, driver: str = "") -> dict:
    spec: dict = {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}}
    if parameters:
        spec["devices"]["config"] = [
            {"requests": [REQUEST], "opaque": {"driver": driver, "parameters": parameters}}
        ]
    return spec


def gpu_config(strategy: str, options: dict) -> dict:
    """NVIDIA's opaque ``GpuConfig`` for a card shared by ``strategy`` (MPS, TimeSlicing)."""
    sharing: dict = {"strategy": strategy}
    if strategy == "TimeSlicing":
        sharing["timeSlicingConfig"] = {"interval": options["time_slice_interval"]}
    return {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": sharing}


def claim_for(s: GpuSlice, options: dict) -> tuple[DeviceClaim, dict[str, str]]:
    """(the claim holding ``s``, the slice's environment in the pod)."""
    check(options)
    sharing = options["sharing"]
    if not s.fractional:
        exactly = _exactly(options["gpu_class"], s.num_gpus, _pin(s, options))
        return DeviceClaim(_spec(exactly)), slice_env(s)
    if sharing == "mig":
        if not s.gpu_model:
            raise EnforcementError(
                "the dra backend needs the GPU's model to choose a MIG profile "
                "(the inventory's productName from ResourceSlices)"
            )
        table = {**MIG_PROFILES, **(options["profiles"] or {})}
        profile = snap(s.milli, s.gpu_model, s.card_memory_mib, table)
        selectors = [_cel(f"{_attr(options, 'profile')} == {json.dumps(profile.name)}")]
        if real_uuids(s):
            selectors += _pin(s, options, "parentUUID")
        env = slice_env(
            s,
            GPULAB_GPU_MEMORY_MIB=str(profile.memory_gb * 1024),
            GPULAB_MIG_PROFILE=profile.name,
        )
        return DeviceClaim(_spec(_exactly(options["mig_class"], 1, selectors))), env
    uuids = real_uuids(s)
    if len(uuids) > 1:
        raise EnforcementError(
            f"the pods of one job or deployment share one claim, and under dra sharing "
            f"{sharing!r} a fraction's claim is its card's; these slices are on "
            f"{len(uuids)} cards: run on one node, ask for whole GPUs, or use sharing 'mig'"
        )
    if len(uuids) != 1:
        raise EnforcementError(
            f"a fraction of a card under dra sharing {sharing!r} references that card's "
            f"shared claim, so it needs the card's UUID as the DRA driver publishes it "
            f"(got {', '.join(s.gpu_uuids) or 'none'}): read the inventory from "
            f'ResourceSlices (c.KubernetesInventory.source = "resourceslices"), or '
            f'use sharing "mig"'
        )
    strategy = "MPS" if sharing == "mps" else "TimeSlicing"
    spec = _spec(
        _exactly(options["gpu_class"], 1, _pin(s, options)),
        gpu_config(strategy, options),
        options["driver"],
    )
    if sharing == "mps":
        # The claim is the card's, shared by slices of every size: each pod's own
        # limits are its MPS client's.
        env = slice_env(
            s,
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(s.core_percent),
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={s.memory_mib}M",
        )
    else:
        env = capped_env(s)
    return DeviceClaim(spec, shared_name=shared_claim_name(uuids[0])), env


def template_slice(s: GpuSlice, options: dict) -> GpuSlice:
    """``s`` as every pod of a job or deployment version holds it: the cards' UUIDs kept
    only for a fraction of a shared card (its one claim); a claim of each pod's own
    pins the model, since each pod's claim is made from the same template."""
    if s.fractional and options["sharing"] != "mig":
        return s
    return replace(s, gpu_uuids=())


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    claim, env = claim_for(s, options)
    return SlicePatch(env=env, claim=claim, **placement(s))


# -- the objects --------------------------------------------------------------------


def _metadata(name: str, labels: dict | None) -> dict:
    meta: dict = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    return meta


def claim_object(name: str, claim: DeviceClaim, labels: dict | None = None) -> dict:
    """A ``resource.k8s.io/v1`` ResourceClaim of ``claim``'s spec."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": _metadata(name, labels),
        "spec": json.loads(json.dumps(claim.spec)),
    }


def claim_template_object(name: str, claim: DeviceClaim, labels: dict | None = None) -> dict:
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate: each pod gets a claim of its own."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(name, labels),
        "spec": {"spec": json.loads(json.dumps(claim.spec))},
    }


def resource_claim(name: str, s: GpuSlice, options: dict | None = None) -> dict:
    """The ResourceClaim holding slice ``s`` (a shared card's claim keeps its own name)."""
    claim, _ = claim_for(s, {**DEFAULTS, **(options or {})})
    return claim_object(claim.shared_name or name, claim)


def resource_claim_template(name: str, s: GpuSlice, options: dict | None = None) -> dict:
    """The ResourceClaimTemplate of ``s``: each pod of a job or deployment gets its own claim."""
    claim, _ = claim_for(s, {**DEFAULTS, **(options or {})})
    if claim.shared_name:
        raise EnforcementError(
            "a fraction of a shared card is one claim of that card, not a template: "
            f"reference ResourceClaim {claim.shared_name}"
        )
    return claim_template_object(name, claim)


def claim_objects(
    slice_patch: SlicePatch, name: str, template: bool, labels: dict | None = None
) -> list[dict]:
    """What a pod of ``slice_patch`` needs created before it: its own claim (or template)
    named ``name``, or the shared claim of its card (created once, for every pod on it)."""
    claim = slice_patch.claim
    if claim is None:
        return []
    if claim.shared_name:
        return [claim_object(claim.shared_name, claim, labels)]
    if template:
        return [claim_template_object(name, claim, labels)]
    return [claim_object(name, claim, labels)]


def pod_claim_source(slice_patch: SlicePatch, name: str, template: bool) -> dict:
    """The pod's ``spec.resourceClaims`` entry for ``slice_patch``'s claim."""
    claim = slice_patch.claim
    if claim is not None and claim.shared_name:
        return {"name": POD_CLAIM, "resourceClaimName": claim.shared_name}
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    return {"name": POD_CLAIM, key: name}
