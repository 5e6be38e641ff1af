"""What a collection's view says to whom (the manager in-process, its store and engine
stood in for)."""

from __future__ import annotations

from types import SimpleNamespace

from gpulab.service.auth import Identity
from gpulab.service.vectors.checks import CollectionLimits
from gpulab.service.vectors.manager import CollectionManager

MODEL = {"job": "j-42", "code_hash": "abc123", "datasets": ["secret-set"], "mlflow_run": "r9"}
ROW = {
    "id": "c1",
    "user": "alice",
    "name": "docs",
    "dim": 4,
    "metric": "cosine",
    "index_type": "hnsw",
    "embed": "bob/ep",
    "share_users": ["carol", "dan"],
    "share_groups": [],
    "created": "2024-01-01T00:00:00+00:00",
    "lineage": {
        "created_by": "alice",
        "embed": {"endpoint": "bob/ep", "version": 3, "model": MODEL},
    },
}


class Engine:
    async def stats(self, owner, cid):
        return {"count": 7, "pending_index_rows": 0}


def manager() -> CollectionManager:
    # bob's endpoint is shared with alice and carol, not dan.
    endpoints = {
        ("bob", "ep"): {"user": "bob", "share_users": ["alice", "carol"], "share_groups": []}
    }
    store = SimpleNamespace(update=lambda cid, **values: None, get=lambda cid: ROW)
    return CollectionManager(
        store=store,
        engine=Engine(),
        limits=CollectionLimits(max_rows=10, max_dim=8, max_per_user=1),
        embedder=None,
        endpoint_lineage=lambda owner, name: None,
        endpoint_row=lambda owner, name: endpoints.get((owner, name)),
    )


async def test_the_models_lineage_is_shown_only_to_who_may_call_the_endpoint():
    """The view said the embedding endpoint's model lineage (its job, code, datasets,
    run) to everyone the collection is shared with; the endpoint's lineage route says
    it only to those who may call the endpoint."""
    m = manager()
    carol, dan = Identity("carol", "user"), Identity("dan", "user")
    admin = Identity("root", "user", admin=True)
    hidden = {"created_by": "alice", "embed": {"endpoint": "bob/ep"}}
    for who, lineage in ((carol, ROW["lineage"]), (admin, ROW["lineage"]), (dan, hidden)):
        (listed,) = await m.views(who, [ROW])
        assert listed["lineage"] == lineage, who.name
        assert (await m.counted_view(who, ROW))["lineage"] == lineage, who.name
    # The owner shares it: what she is answered follows the same rule (she may call it).
    assert (await m.share(Identity("alice", "user"), ROW, {}))["lineage"] == ROW["lineage"]
    # A view for no one in particular (the catalog's) does not say it either.
    assert m.view(ROW)["lineage"] == hidden
