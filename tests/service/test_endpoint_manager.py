"""The deployment manager: its lock is never held while waiting on a replica, a
promotion and a rollback never both retire a version, and a deleted user's name comes
off what was shared with it.

Every user's create, canary, promote, rollback, stop and every cold start take the
deployment manager's one lock. Stopping replicas waited out their grace period
(10 s of SIGTERM, which the replica's code may ignore) under it, for a deletion, a
failed version and a retired one: one user's endpoints that never exit stalled
everyone's. Now a version or deployment being stopped is marked under the lock and
its replicas stopped after it is released.

And a promotion and a rollback at once (within the drain window) used to retire both
versions: every call then answered 503 and the endpoint's logs a 500. The second one
is now refused (409) until the first version is gone.

The real deployment manager, store and loop in this process; the serving backend is a
stand-in whose replicas of the versions named in ``slow`` take as long to stop as
the test says.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gpulab.backend.serving_base import Health, ServingBackend
from gpulab.db.engine import make_engine
from gpulab.service.endpoints.manager import DeploymentManager, DeployRefused
from gpulab.service.endpoints.router import RouterAddress
from gpulab.service.endpoints.settings import EndpointLimits

UNIT = {"gpu_milli": 0, "max_batch_size": 4, "max_latency_ms": 5.0, "max_queue": 8}


class StandInServing(ServingBackend):
    """Replicas that answer ready; those of versions in ``slow`` take until ``go`` is
    set to stop (a model server that ignores SIGTERM for its grace period)."""

    name = "stand-in"

    def __init__(self, root: str):
        super().__init__(root)
        self.slow: set[str] = set()
        self.go = asyncio.Event()
        self.stopping: list[str] = []
        self.failing: set[str] = set()
        self.broken: set[str] = set()

    async def launch(self, dep, rows):
        pass

    async def adopt(self, dep, rows):
        pass

    async def scale(self, dep, replicas, rows):
        if replicas < dep["replicas"] and dep["id"] in self.slow:
            self.stopping.append(dep["id"])
            await self.go.wait()

    async def check(self, dep):
        if dep["id"] in self.failing:
            return Health(0, "failed", "replica 0 exited (5 times in 300 s)", dep["restarts"])
        return Health(dep["replicas"], "running", "ready", dep["restarts"])

    def ready_replicas(self, dep):
        return [(0, "unix:/nonexistent/replica.sock")]

    async def logs(self, dep, replica, max_bytes=0):
        return ""

    async def stop(self, dep):
        self.stopping.append(dep["id"])
        if dep["id"] in self.slow:
            await self.go.wait()
        if dep["id"] in self.broken:
            raise RuntimeError("the cluster answered 500")


class Ledger:
    """No slices (CPU replicas): what the manager asks of the ledger."""

    def __init__(self):
        self.aio = SimpleNamespace(release=self._release)

    def list(self, **kw):
        return []

    async def _release(self, kind, owner):
        return []


@pytest.fixture
async def manager(tmp_path):
    serving = StandInServing(str(tmp_path / "deployments"))

    async def groups_of(user):
        return {}

    async def identify(model):
        return None

    mgr = DeploymentManager(
        ledger=Ledger(),
        engine=make_engine(f"sqlite:///{tmp_path / 'gpulab.sqlite'}"),
        serving=serving,
        preemption=SimpleNamespace(on_placed={}, pending=lambda *a: False),
        groups_of=groups_of,
        identify=identify,
        over_quota=lambda *a: None,
        limits=EndpointLimits(
            slice_sizes=(1000,),
            max_deployment_replicas=4,
            max_user_deployments=5,
            max_model_mib=64,
            model_storage_quota_mib=64,
            cold_start_seconds=1.0,
            stop_with_server=False,
            local=False,
        ),
        prefix="/services/gpulab/",
        data_dir=str(tmp_path),
        max_upload_mib=16,
        router_address=RouterAddress("", "127.0.0.1", 0),
    )
    try:
        yield mgr
    finally:
        serving.go.set()
        await mgr._tasks.cancel()  # noqa: SLF001 - the manager's own tasks (a failed stop)
        await mgr.calls.proxy.close()


def endpoint(mgr, user: str, dep_id: str, canary: str | None = None) -> dict:
    """``user``'s endpoint ``m`` (one replica on the CPU), with a canary beside it."""
    row = {
        "id": dep_id,
        "user": user,
        "name": "m",
        "replicas": 1,
        "max_replicas": 1,
        "target_inflight": 4.0,
        "scale_down_delay_s": 300.0,
        **UNIT,
    }
    dep = mgr.store.add(row)
    if canary is not None:
        mgr.store.add_version(dep_id, canary, 10, {**UNIT, "replicas": 1})
        mgr.store.set_weights({dep_id: 90})
    mgr.live.record(dep)
    return mgr.store.get(dep_id)


async def until(check, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def a_loop_pass(mgr) -> None:
    async with mgr.live.lock:
        await mgr._pass()  # noqa: SLF001 - one pass of the deployment loop


async def test_a_deletion_whose_replicas_take_their_grace_stalls_nobody_else(manager):
    mgr, serving = manager, manager.serving
    alice = endpoint(mgr, "alice", "a1")
    bob = endpoint(mgr, "bob", "b1", canary="b2")
    serving.slow.add("a1")
    stopping = asyncio.ensure_future(mgr.stop_deployment(alice, "stopped by its owner"))
    await until(lambda: "a1" in serving.stopping)
    # alice's replicas take their time: bob's promotion, the loop and calls go on.
    view = await asyncio.wait_for(mgr.versions.promote(bob), 2.0)
    assert [v["weight"] for v in mgr.store.versions("b1")] == [100]
    assert view["id"] == "b1"
    await asyncio.wait_for(a_loop_pass(mgr), 2.0)
    assert mgr.calls.endpoint("alice", "m") is None  # being stopped: no call reaches it
    assert mgr.calls.endpoint("bob", "m") is not None
    # A second stop of hers waits for the first; both say stopped.
    again = asyncio.ensure_future(mgr.stop_deployment(alice, "stopped by its owner"))
    await asyncio.sleep(0.1)
    assert not stopping.done() and not again.done()
    assert mgr.store.find("alice", "m") is not None  # kept until its replicas are gone
    serving.go.set()
    assert (await stopping)["state"] == (await again)["state"] == "stopped"
    assert mgr.store.find("alice", "m") is None and not mgr.live.stopping
    assert serving.stopping.count("a1") == 1


async def test_a_second_stop_is_not_told_stopped_when_the_first_failed(manager):
    mgr, serving = manager, manager.serving
    alice = endpoint(mgr, "alice", "a1")
    serving.slow.add("a1")
    serving.broken.add("a1")
    first = asyncio.ensure_future(mgr.stop_deployment(alice, "stopped by its owner"))
    await until(lambda: "a1" in serving.stopping)
    again = asyncio.ensure_future(mgr.stop_deployment(alice, "stopped by its owner"))
    await asyncio.sleep(0.05)
    serving.go.set()
    for stop in (first, again):
        with pytest.raises(Exception, match="500"):
            await stop
    assert mgr.store.find("alice", "m") is not None  # still there: nothing was released


async def test_a_failed_versions_replicas_are_stopped_outside_the_loops_lock(manager):
    mgr, serving = manager, manager.serving
    alice = endpoint(mgr, "alice", "a1")
    endpoint(mgr, "bob", "b1")
    serving.slow.add("a1")
    serving.failing.add("a1")
    await asyncio.wait_for(a_loop_pass(mgr), 2.0)
    assert mgr.store.version("a1")["state"] == "failed"
    await until(lambda: "a1" in serving.stopping)
    # Its replicas still stopping: the next pass and bob's changes do not wait.
    await asyncio.wait_for(a_loop_pass(mgr), 2.0)
    bob = mgr.store.find("bob", "m")
    await asyncio.wait_for(mgr.stop_deployment(bob, "stopped by its owner"), 2.0)
    assert mgr.calls.ready(alice, mgr.live.deps["a1"].units["a1"]) == []
    serving.go.set()


async def test_replicas_scaled_away_are_stopped_outside_the_lock(manager):
    mgr, serving = manager, manager.serving
    alice = endpoint(mgr, "alice", "a1")
    mgr.store.update("a1", max_replicas=2)
    mgr.store.update_version("a1", replicas=2)
    unit = mgr.live.record(mgr.store.get("a1")).units["a1"]
    serving.slow.add("a1")
    unit.scaling = True
    shrinking = asyncio.ensure_future(mgr.scaling._scale(alice, unit, 1))  # noqa: SLF001
    await until(lambda: "a1" in serving.stopping)
    assert mgr.store.version("a1")["replicas"] == 1  # the loop looks at one from now
    await asyncio.wait_for(a_loop_pass(mgr), 2.0)
    bob = endpoint(mgr, "bob", "b1")
    await asyncio.wait_for(mgr.stop_deployment(bob, "stopped by its owner"), 2.0)
    assert unit.scaling  # the step is not over: the autoscaler waits for it
    serving.go.set()
    await shrinking
    assert not unit.scaling


async def test_a_rollback_during_a_promotion_is_refused_and_one_version_stays(manager):
    mgr, serving = manager, manager.serving
    bob = endpoint(mgr, "bob", "b1", canary="b2")
    serving.slow.add("b1")  # the old version takes its time to stop
    promoting = asyncio.ensure_future(mgr.versions.promote(bob))
    await until(lambda: "b1" in serving.stopping)
    assert mgr.calls.endpoint("bob", "m") is not None  # the endpoint answers meanwhile
    with pytest.raises(DeployRefused) as refused:
        await asyncio.wait_for(mgr.versions.rollback(bob, "rolled back by its owner"), 2.0)
    assert refused.value.status == 409
    assert "version 1 of m is being retired" in str(refused.value)
    with pytest.raises(DeployRefused) as refused:
        await asyncio.wait_for(mgr.versions.promote(bob), 2.0)
    assert refused.value.status == 409
    serving.go.set()
    await promoting
    versions = mgr.store.versions("b1")
    assert [(v["id"], v["weight"]) for v in versions] == [("b2", 100)]
    assert serving.stopping == ["b1"]  # the canary was never retired
    assert mgr.find_version(bob, None)["id"] == "b2"


async def test_a_rollback_to_a_failed_version_is_refused(manager):
    mgr = manager
    bob = endpoint(mgr, "bob", "b1", canary="b2")
    mgr.store.update_version("b1", state="failed", weight=0, message="replica 0 exited")
    mgr.store.set_weights({"b2": 100})
    with pytest.raises(DeployRefused) as refused:
        await mgr.versions.rollback(bob)
    assert refused.value.status == 409 and "would leave no working version" in str(refused.value)
    assert [v["weight"] for v in mgr.store.versions("b1")] == [0, 100]


async def test_a_deployment_without_versions_has_no_logs_to_read(manager):
    mgr = manager
    bob = endpoint(mgr, "bob", "b1")
    mgr.store.remove_version("b1")  # as when two retirements raced
    with pytest.raises(DeployRefused) as refused:
        mgr.find_version(bob, None)
    assert refused.value.status == 404
