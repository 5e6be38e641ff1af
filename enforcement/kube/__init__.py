"""Slice enforcement on Kubernetes: one module per backend, pure functions.

    from gpulab.enforcement.kube import GpuSlice, pod_slice_patch, apply_to_pod

    patch = pod_slice_patch("mig", GpuSlice.of(250, 81920, "H100-80GB", node="gpu-1"))
    pod = apply_to_pod(pod, patch)  # a Pod or a pod template, as a dict

See :mod:`.base` for the hooks a backend provides.
"""

from __future__ import annotations

import copy
from types import ModuleType

from gpulab.enforcement.slice_env import strip_enforcement_vars

from . import dra, hami, kai, mig, mps, nvml_cgroup, timeslice, volcano
from .base import (
    EnforcementError,
    GpuSlice,
    SlicePatch,
    check_options,
    no_gpu_patch,
    simulated_patch,
    without_gpu_annotations,
    without_gpu_resources,
)

BACKENDS: dict[str, ModuleType] = {
    m.NAME: m for m in (hami, mig, mps, timeslice, nvml_cgroup, kai, volcano, dra)
}

__all__ = [
    "BACKENDS",
    "EnforcementError",
    "GpuSlice",
    "SlicePatch",
    "apply_to_pod",
    "backend_names",
    "pod_slice_patch",
    "check_backend",
]


def backend_names() -> list[str]:
    return list(BACKENDS)


def check_backend(name: str, options: dict | None = None) -> dict:
    """The backend's options with defaults filled in; a clear error for bad input."""
    if name not in BACKENDS:
        raise EnforcementError(
            f"unknown enforcement backend {name!r}; choose one of: {', '.join(BACKENDS)}"
        )
    opts = check_options(name, BACKENDS[name].DEFAULTS, options)
    if hasattr(BACKENDS[name], "check"):  # option values a backend checks itself
        BACKENDS[name].check(opts)
    return opts


def pod_slice_patch(
    backend: str, s: GpuSlice, gpu_model: str | None = None, options: dict | None = None
) -> SlicePatch:
    """What ``backend`` adds to a pod holding slice ``s`` (``gpu_model`` overrides ``s``'s)."""
    opts = check_backend(backend, options)
    if gpu_model is not None:
        s = GpuSlice(
            s.milli, s.memory_mib, s.card_memory_mib, gpu_model, s.node, s.gpu_uuids, s.simulated
        )
    if s.milli == 0:
        return no_gpu_patch()
    if s.simulated:
        return simulated_patch(s)
    return BACKENDS[backend].patch(s, opts)


def apply_to_pod(
    pod: dict, patch: SlicePatch, container: int = 0, claim: dict | None = None
) -> dict:
    """A copy of ``pod`` (a Pod, or a template ``{"metadata", "spec"}``) holding the slice.

    GPU resources, GPU-granting annotations and enforcement variables already
    on the pod are dropped first: a GPU comes from the slice or not at all,
    and a slice cannot be widened by whatever built the pod before.

    A slice held through DRA (``patch.claim``) adds the pod's ``spec.resourceClaims``
    entry ``claim`` (:func:`.dra.pod_claim_source`: the pod's own ResourceClaim or
    ResourceClaimTemplate by name; a shared card's claim needs none; a named Pod's own
    defaults to ResourceClaim ``<pod name>-gpu``) and names it in the container's
    ``resources.claims``.
    """
    pod = copy.deepcopy(pod)
    meta = pod.setdefault("metadata", {})
    spec = pod.setdefault("spec", {})
    annotations = {**without_gpu_annotations(meta.get("annotations")), **patch.annotations}
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    if patch.labels:
        meta["labels"] = {**(meta.get("labels") or {}), **patch.labels}
    if patch.scheduler_name:
        spec["schedulerName"] = patch.scheduler_name
    if patch.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **patch.node_selector}
    if patch.tolerations:
        have = list(spec.get("tolerations") or [])
        spec["tolerations"] = have + [dict(t) for t in patch.tolerations if dict(t) not in have]
    c = spec["containers"][container]
    resources = c.get("resources") or {}
    for key in ("limits", "requests"):
        kept = without_gpu_resources(resources.get(key))
        if key == "limits":
            kept.update(patch.limits)
        if kept:
            resources[key] = kept
        else:
            resources.pop(key, None)
    if patch.claim is not None:
        own = f"{meta['name']}-gpu" if pod.get("kind") == "Pod" and meta.get("name") else ""
        if claim is None and not (patch.claim.shared_name or own):
            raise EnforcementError(
                "a slice held through DRA needs the name of the pod's ResourceClaim or "
                "ResourceClaimTemplate: pass claim=dra.pod_claim_source(patch, name, template)"
            )
        entry = claim or dra.pod_claim_source(patch, own, template=False)
        have = [e for e in spec.get("resourceClaims") or [] if e.get("name") != entry["name"]]
        spec["resourceClaims"] = have + [entry]
        named = [e for e in resources.get("claims") or [] if e.get("name") != entry["name"]]
        resources["claims"] = named + [{"name": entry["name"]}]
    if resources or "resources" in c:
        c["resources"] = resources
    kept = strip_enforcement_vars({e["name"]: e for e in c.get("env") or []})
    c["env"] = [e for name, e in kept.items() if name not in patch.env] + [
        {"name": k, "value": v} for k, v in patch.env.items()
    ]
    return pod
