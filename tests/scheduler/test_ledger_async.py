"""The ledger's async face: the event loop keeps running while a write waits for the
database's lock, errors arrive at the ``await``, and concurrent calls still never
oversubscribe (real SQLite file)."""

import asyncio
import sqlite3

import pytest
from support.wait import wait_until_async

from gpulab.scheduler.ledger import NoCapacity


async def test_loop_runs_while_a_write_waits_for_the_lock(ledger, tmp_path):
    # Another process's writer, in effect: it holds SQLite's write lock.
    other = sqlite3.connect(tmp_path / "ledger.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.create_task(heartbeat())
    placing = asyncio.create_task(ledger.aio.allocate("alice", "server", "alice/", 250))
    # The loop ticks on (20 beats) while the write waits ...
    await wait_until_async(lambda: ticks >= 20, "20 heartbeats while the write waits")
    assert not placing.done()  # ... still waiting on the lock
    other.execute("COMMIT")
    other.close()
    rows = await asyncio.wait_for(placing, 30)
    beat.cancel()
    assert [r["milli"] for r in rows] == [250]
    assert (await ledger.aio.list(user="alice"))[0]["owner"] == "alice/"


async def test_errors_arrive_at_the_await(ledger):
    await ledger.aio.allocate("bob", "server", "bob/", 2000)
    with pytest.raises(NoCapacity):
        await ledger.aio.allocate("carol", "server", "carol/", 1000)
    assert await ledger.aio.release("server", "bob/")
    assert await ledger.aio.usage() == {}


async def test_concurrent_calls_never_oversubscribe(ledger):
    async def ask(i):
        try:
            return await ledger.aio.allocate(f"u{i}", "server", f"u{i}/", 250)
        except NoCapacity:
            return None

    results = await asyncio.gather(*(ask(i) for i in range(12)))
    assert sum(r is not None for r in results) == 8
    assert sorted((await ledger.aio.allocated_by_gpu()).values()) == [1000, 1000]
    sizes = {a.milli: a.count for a in await ledger.aio.availability("u0", [250, 1000])}
    assert sizes == {250: 0, 1000: 0}
    assert await ledger.aio.reconcile("server", {"u0/"}) and len(await ledger.aio.list()) == 1
