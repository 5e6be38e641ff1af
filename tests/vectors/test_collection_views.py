"""What a collection's view says to whom (the manager in-process, its store and engine
stood in for)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gpulab.service.auth import Identity
from gpulab.service.vectors.checks import CollectionLimits, Refused
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


class SlowEngine:
    """An engine whose writes wait until released: two inserts at once are both in
    flight when the second's room is checked."""

    def __init__(self):
        self.rows = 0
        self.release = asyncio.Event()

    async def count(self, owner, cid):
        return self.rows

    async def write(self, owner, cid, rows, upsert):
        await self.release.wait()
        self.rows += len(rows)


async def test_writes_at_once_cannot_together_pass_the_owners_rows():
    """Each insert passed the check on the count before the others' rows were in, so
    N at once overshot an owner's rows by N batches; the room is now held for each
    write until it ends."""
    engine = SlowEngine()
    m = CollectionManager(
        store=SimpleNamespace(list=lambda owner: [ROW]),
        engine=engine,
        limits=CollectionLimits(max_rows=10, max_dim=4, max_per_user=1, max_rows_per_user=5),
        embedder=None,
        endpoint_lineage=lambda owner, name: None,
    )
    alice = Identity("alice", "user")
    body = {"vectors": [[1.0, 0.0, 0.0, 0.0]] * 3}
    first = asyncio.create_task(m.write(alice, ROW, dict(body), upsert=True))
    second = asyncio.create_task(m.write(alice, ROW, dict(body), upsert=True))
    await asyncio.sleep(0.1)  # both checked; the first waits in the engine
    engine.release.set()
    answers = await asyncio.gather(first, second, return_exceptions=True)
    assert answers[0] == {"ids": answers[0]["ids"], "count": 3}
    assert isinstance(answers[1], Refused) and answers[1].status == 403
    assert "alice's collections hold 3 rows; 3 more would pass the 5" in str(answers[1])
    assert engine.rows == 3
    for task in m._tasks:
        task.cancel()
