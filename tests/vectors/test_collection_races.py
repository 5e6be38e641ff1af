"""What happens when calls overlap: an un-share takes effect whatever lookups and drops
run beside it, one user's calls (in their own collections and in those shared with
them) leave another user's a free slot, and two inserts of one id at once are one row
and one 409. The manager in-process over a collections table in memory whose reads
and writes the test holds (a thread waits on an event), and over the real embedded
engine's handlers (FAISS behind its log, on the test's files) called in-process."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest

from gpulab.service.auth import Identity
from gpulab.service.vectors import engine_protocol as protocol
from gpulab.service.vectors.checks import CollectionLimits, Refused
from gpulab.service.vectors.embedded import PER_OWNER, THREADS, EmbeddedEngine
from gpulab.service.vectors.embedded_store import Store
from gpulab.service.vectors.engine import database_of
from gpulab.service.vectors.engine_server import Handlers, handler
from gpulab.service.vectors.manager import CollectionManager

DIM = 4
ALICE, BOB, CAROL = (Identity(n, "user") for n in ("alice", "bob", "carol"))


def row(cid: str, owner: str, name: str, share_users=()) -> dict:
    return {
        "id": cid,
        "user": owner,
        "name": name,
        "dim": DIM,
        "metric": "cosine",
        "index_type": "flat",
        "embed": None,
        "share_users": list(share_users),
        "share_groups": [],
        "created": "2024-01-01T00:00:00+00:00",
        "lineage": {},
    }


class Table:
    """The collections table in memory. ``hold(method)``: the next call of it waits in
    its thread (``find`` after its read, ``update`` before its write) until ``go``."""

    def __init__(self, *rows: dict):
        self.rows = {r["id"]: copy.deepcopy(r) for r in rows}
        self._held: dict[str, tuple[threading.Event, threading.Event]] = {}

    def hold(self, method: str) -> tuple[threading.Event, threading.Event]:
        self._held[method] = (threading.Event(), threading.Event())
        return self._held[method]

    def _wait(self, method: str) -> None:
        held = self._held.pop(method, None)
        if held is not None:
            reached, go = held
            reached.set()
            assert go.wait(30)

    def find(self, owner, name):
        found = next(
            (
                copy.deepcopy(r)
                for r in self.rows.values()
                if (r["user"], r["name"]) == (owner, name)
            ),
            None,
        )
        self._wait("find")
        return found

    def get(self, cid):
        return copy.deepcopy(self.rows.get(cid))

    def update(self, cid, **values):
        self._wait("update")
        self.rows[cid].update(copy.deepcopy(values))

    def remove(self, cid):
        self.rows.pop(cid, None)

    def list(self, user=None):
        return [copy.deepcopy(r) for r in self.rows.values() if user in (None, r["user"])]


class NoEngine:
    async def drop(self, owner, cid):
        pass


def manager(table, engine=None) -> CollectionManager:
    return CollectionManager(
        store=table,
        engine=engine or NoEngine(),
        limits=CollectionLimits(max_rows=100, max_dim=DIM, max_per_user=5),
        embedder=None,
        endpoint_lineage=lambda owner, name: None,
    )


async def refused_to(m: CollectionManager, who, owner: str, name: str) -> int:
    with pytest.raises(Refused) as refused:
        await m.find(who, owner, name)
    return refused.value.status


async def test_an_unshare_takes_effect_though_a_drop_finished_while_it_saved():
    """Bob's lookups had alice/docs cached. Alice un-shared it; a drop (anyone's, of
    another collection) finished while her save ran in its thread, so the share left
    the cache as it was, and bob kept using her collection until a restart."""
    table = Table(row("c1", "alice", "docs", ["bob"]), row("c2", "carol", "notes"))
    m = manager(table)
    docs = await m.find(BOB, "alice", "docs")  # cached
    reached, go = table.hold("update")
    share = asyncio.create_task(m.share(ALICE, docs, {"share_users": []}))
    assert await asyncio.to_thread(reached.wait, 30)
    await m.drop(await m.find(CAROL, "carol", "notes"))
    go.set()
    assert (await share)["share_users"] == []
    assert await refused_to(m, BOB, "alice", "docs") == 403
    assert (await m.find(ALICE, "alice", "docs"))["share_users"] == []


async def test_a_lookup_read_before_an_unshare_is_not_cached_after_it():
    """After a restart (nothing cached) bob's lookup read alice's row; she un-shared
    it before his read came back, and his read was cached over her change."""
    table = Table(row("c1", "alice", "docs", ["bob"]))
    m = manager(table)
    reached, go = table.hold("find")
    lookup = asyncio.create_task(m.find(BOB, "alice", "docs"))
    assert await asyncio.to_thread(reached.wait, 30)  # read, not answered yet
    docs = table.get("c1")
    assert (await m.share(ALICE, docs, {"share_users": []}))["share_users"] == []
    go.set()
    assert (await lookup)["id"] == "c1"  # the call under way gets what it read, once
    assert await refused_to(m, BOB, "alice", "docs") == 403


async def test_a_share_cached_as_saved_when_nothing_came_between():
    table = Table(row("c1", "alice", "docs"))
    m = manager(table)
    docs = await m.find(ALICE, "alice", "docs")
    await m.share(ALICE, docs, {"share_users": ["bob"]})
    table.rows["c1"]["share_users"] = []  # changed behind the manager's back: not read
    assert (await m.find(BOB, "alice", "docs"))["id"] == "c1"


class InProcessEngine:
    """The engine's real handlers on the test's files, called as the socket would."""

    def __init__(self, root: str):
        self.handlers = Handlers(Store(root))

    async def call(self, method: str, request: bytes) -> bytes:
        return await asyncio.to_thread(handler(getattr(self.handlers, method)), request)

    def close(self):
        self.handlers.store.close()


async def test_two_inserts_of_one_id_at_once_are_one_row_and_one_409(tmp_path):
    """The manager looked for the ids, then wrote: two inserts of one id at once both
    found none, and the second silently replaced the first."""
    engine = EmbeddedEngine("unix:/nowhere")
    engine.client = fake = InProcessEngine(str(tmp_path / "faiss"))
    table = Table(row("c1", "alice", "docs"))
    m = manager(table, engine)
    try:
        await engine.create("alice", "c1", DIM, "cosine", "flat")
        writing, checked, go = engine.write, asyncio.Event(), asyncio.Event()

        async def write(*args, **kwargs):  # the first waits until the second is written
            if not checked.is_set():
                checked.set()
                await go.wait()
            return await writing(*args, **kwargs)

        engine.write = write
        docs = table.get("c1")
        body = {"ids": ["a"], "vectors": [[1.0, 0.0, 0.0, 0.0]], "metadata": [{"by": "first"}]}
        first = asyncio.create_task(m.write(ALICE, docs, body, upsert=False))
        await checked.wait()
        other = {**body, "vectors": [[0.0, 1.0, 0.0, 0.0]], "metadata": [{"by": "second"}]}
        assert await m.write(BOB, docs, other, upsert=False) == {"ids": ["a"], "count": 1}
        go.set()
        with pytest.raises(Refused) as refused:
            await first
        assert refused.value.status == 409
        assert str(refused.value) == (
            "1 of these ids are in alice/docs already (a); use upsert to replace them"
        )
        assert await engine.count("alice", "c1") == 1
        (hit,) = (await engine.search("alice", "c1", [[0.0, 1.0, 0.0, 0.0]], 1, "cosine", ""))[0]
        assert (hit["id"], hit["metadata"]) == ("a", {"by": "second"})
        # An upsert replaces it, as before.
        await m.write(ALICE, docs, body, upsert=True)
        assert await engine.count("alice", "c1") == 1
    finally:
        for task in m._tasks:  # noqa: SLF001 - the seal after the writes
            task.cancel()
        fake.close()


class HeldCalls:
    """An engine that holds every search until released; says whose arrived."""

    def __init__(self):
        self.release = asyncio.Event()
        self.arrived: list[str] = []

    async def call(self, method, request):
        header, vectors = protocol.unpack(request)
        self.arrived.append(header["db"])
        await self.release.wait()
        return protocol.pack({"results": [[] for _ in vectors]})


async def test_a_callers_slots_are_the_same_in_anyones_collections():
    """The work queues were keyed by the collection's owner: bob, given carol's
    collection, took carol's 4 slots and his own 4, all 8 the engine has, and alice's
    search waited out its time limit (504)."""
    engine = EmbeddedEngine("unix:/nowhere", call_timeout=60)
    engine.client = held = HeldCalls()
    table = Table(row("c1", "carol", "shared", ["bob"]), row("c2", "bob", "own"))
    table.rows["c3"] = row("c3", "alice", "hers")
    m = manager(table, engine)
    query = {"vector": [1.0, 0.0, 0.0, 0.0]}
    # Searches of other k's are not batched together: each is a call of its own.
    bobs = [
        asyncio.create_task(m.search(BOB, table.get(cid), {**query, "k": k}))
        for k in range(1, THREADS + 1)
        for cid in ("c1", "c2")
    ]
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(held.arrived) == PER_OWNER  # bob's share of the slots, whoever's
    alices = asyncio.create_task(m.search(ALICE, table.get("c3"), query))
    for _ in range(50):
        await asyncio.sleep(0)
    assert held.arrived[-1] == database_of("alice")  # at once, beside bob's
    held.release.set()
    assert (await alices)["hits"] == []
    await asyncio.gather(*bobs)
    assert len(held.arrived) == 2 * THREADS + 1
