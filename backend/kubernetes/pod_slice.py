"""A slice in a pod: the enforcement backend's patch for the card the ledger chose,
shared by jobs' pods and endpoints' replicas."""

from __future__ import annotations

from gpulab.enforcement.kube import GpuSlice, apply_to_pod, pod_slice_patch


def slice_pod_patch(
    enforcement: str, options: dict, milli: int, allocations: list[dict], by_uuid: dict
):
    """A function putting a slice of ``milli`` (on the card the ledger chose) into a pod
    template through the enforcement backend; None for no GPU."""
    if not milli:
        return None
    first = by_uuid.get(allocations[0]["gpu_uuid"]) if allocations else None
    piece = GpuSlice.of(milli, first.memory_mib if first else 0, first.model if first else "")
    patch = pod_slice_patch(enforcement, piece, options=options)
    return lambda template: apply_to_pod(template, patch)
