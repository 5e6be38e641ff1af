"""What a collection's view says to whom (the manager in-process, its store and engine
stood in for)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest.mock import ANY

import pytest

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
    async def stats(self, owner, cid, caller=None):
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

    async def usage(self, owner, cid, caller=None):
        return self.rows, self.rows * 16

    async def write(self, owner, cid, rows, upsert, caller=None, new_ids=False):
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


async def test_share_lists_are_shown_only_to_the_owner_and_admins():
    """Everyone alice's collection was shared with read whom else she shared it with
    (GET /collections and GET /collections/{owner}/{name}); an endpoint's lists are
    its owner's alone, and so are a collection's."""
    m = manager()
    carol, dan = Identity("carol", "user"), Identity("dan", "user")
    alice, admin = Identity("alice", "user"), Identity("root", "user", admin=True)
    for who, users in (
        (alice, ["carol", "dan"]),
        (admin, ["carol", "dan"]),
        (carol, []),
        (dan, []),
    ):
        (listed,) = await m.views(who, [ROW])
        one = await m.counted_view(who, ROW)
        for view in (listed, one):
            assert (view["share_users"], view["share_groups"]) == (users, []), who.name
    assert (await m.share(alice, ROW, {}))["share_users"] == ["carol", "dan"]


class Embedder:
    """An embedding endpoint's answers, as its model server gave them."""

    def __init__(self, answer):
        self.answer = answer

    async def __call__(self, who, owner, name, texts):
        return [list(v) for v in self.answer(len(texts))]


class Written:
    filter_text = staticmethod(str)

    def __init__(self):
        self.rows = []

    async def usage(self, owner, cid, caller=None):
        return len(self.rows), 0

    async def count(self, owner, cid, caller=None):
        return len(self.rows)

    async def write(self, owner, cid, rows, upsert, caller=None, new_ids=False):
        self.rows += rows

    async def search(self, owner, cid, vectors, k, metric, filter, caller=None):
        return [[] for _ in vectors]


def texts_manager(answer, engine=None, **limits) -> CollectionManager:
    return CollectionManager(
        store=SimpleNamespace(list=lambda owner: [ROW]),
        engine=engine or Written(),
        limits=CollectionLimits(max_rows=10, max_dim=4, max_per_user=1, **limits),
        embedder=Embedder(answer),
        endpoint_lineage=lambda owner, name: None,
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            lambda n: [[float("nan"), 0.0, 0.0, 1.0]] * n,
            "embeddings[0] holds a value that is not finite",
        ),
        (lambda n: [[float("inf"), 0.0, 0.0, 1.0]] * n, "not finite"),
        (lambda n: [[1e300, 0.0, 0.0, 1.0]] * n, "outside float32's range"),
        (
            lambda n: [["x", 0.0, 0.0, 1.0]] * n,
            "embeddings[0] holds something that is not a number",
        ),
        (lambda n: [[True, 0.0, 0.0, 1.0]] * n, "not a number"),
        (lambda n: [[0.5, 0.5, 0.5, 0.5]] * (n - 1), "gave 1 vectors for 2 texts"),
    ],
)
async def test_what_a_model_server_gives_back_is_checked_as_a_users_vectors(answer, said):
    """NaN and Infinity from a user's model server (JSON's parser takes them) were
    stored in the index every search of the collection uses; a value that was not a
    number was a 500."""
    engine = Written()
    m = texts_manager(answer, engine)
    row = {**ROW, "embed": "bob/ep", "dim": 4}
    alice = Identity("alice", "user")
    for call in (
        lambda: m.write(alice, row, {"texts": ["one", "two"]}, upsert=False),
        lambda: m.search(alice, row, {"texts": ["one", "two"]}),
    ):
        with pytest.raises(Refused) as refused:
            await call()
        assert refused.value.status == 502, refused.value
        assert "endpoint bob/ep gave" in str(refused.value) and said in str(refused.value)
    assert engine.rows == []


async def test_a_collection_is_not_made_over_an_endpoint_that_gives_nan():
    class Engine(Written):
        async def create(self, *args):
            raise AssertionError("not made")

    m = texts_manager(lambda n: [[float("nan"), 1.0]] * n, Engine())
    m.store = SimpleNamespace(list=lambda owner: [])
    with pytest.raises(Refused) as refused:
        await m.create(Identity("alice", "user"), {"name": "d", "embed": "bob/ep"})
    assert refused.value.status == 502 and "endpoint bob/ep gave" in str(refused.value)


class Budgeted(Written):
    """An engine whose collections already take ``held`` bytes."""

    def __init__(self, held: int):
        super().__init__()
        self.held = held

    async def usage(self, owner, cid, caller=None):
        return len(self.rows), self.held


async def test_one_users_collections_take_at_most_their_bytes():
    """5,000,000 rows of 64 KiB of small keys each: one user's inserts took the engine's
    memory (each 62 MiB request about 625 MiB), and the restarted engine died again
    reloading them. Rows cost their vector and their metadata, each key counted."""
    from gpulab.service.vectors import row_cost

    engine = Budgeted(held=900)
    m = texts_manager(lambda n: [], engine, max_bytes_per_user=1000)
    alice = Identity("alice", "user")
    fits = {"vectors": [[1.0, 0.0, 0.0, 0.0]], "metadata": [{"k": 1}]}
    cost = 16 + row_cost.json_size({"k": 1}) + row_cost.PER_ITEM
    assert cost == 87
    assert await m.write(alice, ROW, fits, upsert=False) == {"ids": ANY, "count": 1}
    with pytest.raises(Refused) as refused:
        await m.write(alice, ROW, fits, upsert=False)
    assert refused.value.status == 403
    assert str(refused.value).startswith(
        "alice's collections take 0.0 MiB of the vector engine's memory"
    )
    assert "c.VectorSettings.max_mib_per_user" in str(refused.value)
    assert "keep less metadata per row" in str(refused.value)
    assert len(engine.rows) == 1
    for task in m._tasks:  # noqa: SLF001 - the seal after the write
        task.cancel()
