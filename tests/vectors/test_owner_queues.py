"""Per-owner work queues: bob's queued searches do not delay alice's. Observed by the
order calls start in, with calls that end when the test says (no timing)."""

from __future__ import annotations

import asyncio

from gpulab.service.vectors.owner_queues import OwnerQueues


class Calls:
    def __init__(self, queues: OwnerQueues):
        self.queues = queues
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def submit(self, owner: str, name: str) -> None:
        self.release[name] = asyncio.Event()

        async def call():
            self.started.append(name)
            await self.release[name].wait()
            return name

        self.tasks[name] = asyncio.create_task(self.queues.run(owner, call))

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def finish(self, name: str) -> None:
        self.release[name].set()
        assert await self.tasks[name] == name
        await self.settle()


async def test_alice_runs_beside_bob_s_expensive_searches():
    """Bob may hold at most 2 of the 3 slots: the third is alice's at once."""
    calls = Calls(OwnerQueues(slots=3, per_owner=2))
    for i in range(5):
        calls.submit("bob", f"bob{i}")
    await calls.settle()
    calls.submit("alice", "alice0")
    await calls.settle()
    assert calls.started == ["bob0", "bob1", "alice0"]
    await calls.finish("alice0")
    await calls.finish("bob0")
    assert calls.started == ["bob0", "bob1", "alice0", "bob2"]
    for name in ("bob1", "bob2", "bob3", "bob4"):
        calls.release[name].set()
    await asyncio.gather(*calls.tasks.values())
    assert calls.queues.busy == 0 and not calls.queues.waiting


async def test_a_freed_slot_goes_to_the_next_owner_in_turn_not_the_first_queued():
    calls = Calls(OwnerQueues(slots=1, per_owner=1))
    for i in range(4):
        calls.submit("bob", f"bob{i}")
    await calls.settle()
    calls.submit("alice", "alice0")
    calls.submit("carol", "carol0")
    await calls.settle()
    assert calls.started == ["bob0"]
    for name in ("bob0", "alice0", "carol0", "bob1", "bob2"):
        await calls.finish(name)
    # Round robin over those waiting: bob, just served, goes behind alice and carol.
    assert calls.started == ["bob0", "alice0", "carol0", "bob1", "bob2", "bob3"]
    await calls.finish("bob3")


async def test_a_cancelled_wait_gives_its_turn_on():
    calls = Calls(OwnerQueues(slots=1, per_owner=1))
    calls.submit("bob", "bob0")
    calls.submit("alice", "alice0")
    calls.submit("carol", "carol0")
    await calls.settle()
    calls.tasks["alice0"].cancel()  # its caller gave up (a timeout) while it waited
    await calls.finish("bob0")
    assert calls.started == ["bob0", "carol0"]
    await calls.finish("carol0")
    assert calls.queues.busy == 0 and not calls.queues.waiting


async def test_one_owners_slow_calls_on_a_milvus_cluster_leave_threads_for_another():
    """The Milvus client's pool of 8 threads was first come, first served: 8 slow
    searches of bob's held every thread until they ended."""
    import threading

    from gpulab.service.vectors.engine import THREADS, VectorEngine

    engine = VectorEngine("http://127.0.0.1:9", call_timeout=60)
    gate = threading.Event()
    try:
        bobs = [asyncio.ensure_future(engine._call(gate.wait, "bob")) for _ in range(THREADS)]
        await asyncio.sleep(0.2)
        answer = await asyncio.wait_for(engine._call(lambda: "alice's", "alice"), 10)
        assert answer == "alice's"
        gate.set()
        assert all(await asyncio.gather(*bobs))
    finally:
        gate.set()
        engine.pool.shutdown(wait=False)
