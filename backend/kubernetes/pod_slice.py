"""A slice in a pod: the enforcement backend's patch for the card the ledger chose,
shared by jobs' pods and endpoints' replicas.

With the ``dra`` backend the pods' devices come from a ResourceClaimTemplate of the
job or deployment version (or a shared card's ResourceClaim): :func:`slice_claim_objects`
gives what is created before the pods, under the name the pods reference.
"""

from __future__ import annotations

from gpulab.enforcement.kube import GpuSlice, SlicePatch, apply_to_pod, dra, pod_slice_patch


def slice_patch(
    enforcement: str, options: dict, milli: int, allocations: list[dict], by_uuid: dict
) -> SlicePatch | None:
    """The patch of a pod holding ``milli`` on the card the ledger chose; None for no GPU."""
    if not milli:
        return None
    first = by_uuid.get(allocations[0]["gpu_uuid"]) if allocations else None
    model = first.model if first else ""
    piece = GpuSlice.of(milli, first.memory_mib if first else 0, model)
    if enforcement == dra.NAME:
        # Every pod of the template gets the same claim: only a shared card's claim
        # may name the card (the ledger's rows say which); others pin the model.
        uuids = tuple(dict.fromkeys(a["gpu_uuid"] for a in allocations))
        piece = dra.template_slice(
            GpuSlice.of(milli, piece.card_memory_mib, model, gpu_uuids=uuids), options
        )
    return pod_slice_patch(enforcement, piece, options=options)


def slice_pod_patch(
    enforcement: str,
    options: dict,
    milli: int,
    allocations: list[dict],
    by_uuid: dict,
    claim_name: str = "",
):
    """A function putting a slice of ``milli`` (on the card the ledger chose) into a pod
    template through the enforcement backend; None for no GPU. ``claim_name`` names the
    ResourceClaimTemplate the pods reference under ``dra``."""
    patch = slice_patch(enforcement, options, milli, allocations, by_uuid)
    if patch is None:
        return None
    source = dra.pod_claim_source(patch, claim_name, template=True) if patch.claim else None
    return lambda template: apply_to_pod(template, patch, claim=source)


def slice_claim_objects(
    enforcement: str,
    options: dict,
    milli: int,
    allocations: list[dict],
    by_uuid: dict,
    claim_name: str,
    labels: dict | None = None,
) -> list[dict]:
    """The DRA objects the pods of :func:`slice_pod_patch` need first (none but under dra)."""
    patch = slice_patch(enforcement, options, milli, allocations, by_uuid)
    if patch is None or patch.claim is None:
        return []
    return dra.claim_objects(patch, claim_name, template=True, labels=labels)
