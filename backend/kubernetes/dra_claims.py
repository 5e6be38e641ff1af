"""DRA claims sent to the cluster: a job's or endpoint's ResourceClaimTemplate, a card's
shared ResourceClaim (``gpulab.enforcement.kube.dra`` builds them).

They go through the generic object API (``/apis/resource.k8s.io/v1/...``), which
every ``kubernetes_asyncio`` release speaks, whatever typed clients it has.
"""

from __future__ import annotations

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"


def claim_plural(obj: dict) -> str:
    return {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[
        obj["kind"]
    ]


async def create_claims(api, namespace: str, objects: list[dict]) -> None:
    """Create ``objects``. A card's shared claim already there is the card's (kept); a
    template already there is an earlier launch's, replaced by this one's (deleted and
    made again: a claim's spec cannot be changed)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api)
    for obj in objects:
        where = (DRA_GROUP, DRA_VERSION, namespace, claim_plural(obj))
        try:
            await custom.create_namespaced_custom_object(*where, obj)
        except ApiException as e:
            if e.status != 409:
                raise
            if obj["kind"] == "ResourceClaimTemplate":
                await custom.delete_namespaced_custom_object(*where, obj["metadata"]["name"])
                await custom.create_namespaced_custom_object(*where, obj)


async def delete_claim(api, namespace: str, name: str, template: bool) -> None:
    """Delete a claim (or template) of an owner; one already gone is fine."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    plural = "resourceclaimtemplates" if template else "resourceclaims"
    try:
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            DRA_GROUP, DRA_VERSION, namespace, plural, name
        )
    except ApiException as e:
        if e.status != 404:
            raise
