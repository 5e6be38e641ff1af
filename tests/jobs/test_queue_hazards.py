"""What could stall or break the job queue: a gang no pool could place even empty (it
would wait at the head for ever, and every job behind it), the queue's ordering on the
event loop, a cancel whose pool left the config, a fair-share half-life the usage scan
cannot take."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest
from support.service import running_service
from support.wait import wait_until_async
from traitlets import TraitError

from gpulab.backend.spec import JobSpec
from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import parse_simulated
from gpulab.scheduler.ledger import Ledger
from gpulab.scheduler.policy import get_policy
from gpulab.service.jobs.book import JobBook, JobRefused
from gpulab.service.jobs.places import JobPlaces
from gpulab.service.jobs.pools import Pool
from gpulab.service.jobs.queue_settings import JobQueue


class _Backend:
    """Runs anything; ``nodes_apart``: each node rank on a machine of its own (Slurm)."""

    name = "fake"

    def __init__(self, nodes_apart: bool):
        self.nodes_apart = nodes_apart

    def check(self, spec) -> None:
        pass


class _Pools:
    def __init__(self, pool: Pool):
        self.list = [pool]
        self.by_name = {pool.name: pool}

    def for_job(self, pool: str, backend: str) -> list[Pool]:
        return self.list


def _places(tmp_path, nodes: int, gpus_per_node: str, nodes_apart: bool = False) -> JobPlaces:
    gpus = [
        dataclasses.replace(g, pool="p")
        for n in range(nodes)
        for g in parse_simulated(gpus_per_node, node=f"n{n}")
    ]
    engine = make_engine(f"sqlite:///{tmp_path}/ledger.sqlite")
    ledger = Ledger(engine, gpus, get_policy("best-fit"))
    book = JobBook(
        ledger=ledger,
        pools=_Pools(Pool("p", object, _Backend, gpus=gpus)),
        root=str(tmp_path),
        backends={"p": _Backend(nodes_apart)},
        order=None,
        over_quota=lambda *a: None,
    )
    return JobPlaces(book)


def _spec(**fields) -> JobSpec:
    return JobSpec.from_dict({"code": "print(1)", **fields})


@pytest.mark.parametrize(
    "nodes, gpus, nodes_apart, fields, told",
    [
        # Each 3-GPU node holds one 2-GPU rank: 6 GPUs, yet room for 2 ranks, not 3.
        (
            2,
            "3xA100-80GB",
            False,
            {"gpu_milli": 2000, "nproc_per_node": 3},
            "the job has 3 ranks of 2 GPUs but this cluster holds at most 2",
        ),
        # 3/4 GPU does not divide a GPU: 4 GPUs hold 4 such ranks, not 5.
        (
            1,
            "4xA100-80GB",
            False,
            {"gpu_milli": 750, "nproc_per_node": 5},
            "the job has 5 ranks of 3/4 GPU but this cluster holds at most 4",
        ),
        # Node ranks on machines of their own: 3 ranks of a node never share 2-GPU nodes.
        (
            3,
            "2xA100-80GB",
            True,
            {"gpu_milli": 1000, "nodes": 2, "nproc_per_node": 3},
            "needs 3 ranks of 1 GPU on a machine of its own, and no machine here holds more than 2",
        ),
    ],
)
def test_a_gang_no_empty_pool_could_place_is_refused_at_submit(
    tmp_path, nodes, gpus, nodes_apart, fields, told
):
    places = _places(tmp_path, nodes, gpus, nodes_apart)
    with pytest.raises(JobRefused) as refused:
        places.places_for(_spec(**fields))
    assert refused.value.status == 409
    assert told in str(refused.value)
    assert "even when every GPU is free; use" in str(refused.value)


@pytest.mark.parametrize(
    "nodes, gpus, nodes_apart, fields",
    [
        (2, "3xA100-80GB", False, {"gpu_milli": 2000, "nproc_per_node": 2}),
        (1, "4xA100-80GB", False, {"gpu_milli": 750, "nproc_per_node": 4}),
        (3, "2xA100-80GB", False, {"gpu_milli": 1000, "nodes": 2, "nproc_per_node": 3}),
        (3, "2xA100-80GB", True, {"gpu_milli": 1000, "nodes": 3, "nproc_per_node": 2}),
    ],
)
def test_a_gang_an_empty_pool_could_place_is_taken(tmp_path, nodes, gpus, nodes_apart, fields):
    places = _places(tmp_path, nodes, gpus, nodes_apart)
    assert [p.name for p in places.places_for(_spec(**fields))] == ["p"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e10, 0.0])
def test_a_half_life_the_usage_scan_cannot_take_stops_the_start(value):
    with pytest.raises(TraitError) as refused:
        JobQueue(fair_share_half_life_seconds=value)
    assert "c.JobQueue.fair_share_half_life_seconds must be a number of seconds above 0" in str(
        refused.value
    )
    assert JobQueue(fair_share_half_life_seconds=1e8).fair_share_half_life_seconds == 1e8


async def _hold_the_gpu(svc, user: str) -> None:
    """``user``'s server holds the one card: whole-card jobs wait for it."""
    svc.create_user(user)
    svc.fake_hub.users[user]["servers"][""] = {"ready": True}
    body = {"user": user, "owner_kind": "server", "owner": f"{user}/", "gpu_milli": 1000}
    r = await svc.request("POST", "/allocations", json=body)
    assert r.status_code == 201, r.text


@pytest.mark.slow
async def test_the_queue_is_ordered_off_the_event_loop(tmp_path):
    """Ordering reads every user's decayed use (a scan of the usage table): never on the
    service's event loop, neither in each pass nor for a submit's answer."""
    async with running_service(tmp_path / "svc", simulate="1xA100-80GB") as svc:
        queue = svc.app.jobs.book.queue
        loop_thread = threading.get_ident()
        on_loop: list[int] = []
        order = queue.order

        def watched(rows):
            if threading.get_ident() == loop_thread:
                on_loop.append(len(rows))
            return order(rows)

        queue.order = watched
        await _hold_the_gpu(svc, "carol")
        ids = []
        for user in ("alice", "bob"):  # two users: the order reads their use
            token = svc.create_user(user)
            r = await svc.request(
                "POST", "/jobs", token, json={"code": "print(1)", "gpu_milli": 1000}
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        def head_waits():  # the one behind it waits without a word
            return any("waiting for free GPUs" in queue.get(i)["message"] for i in ids) or None

        await wait_until_async(head_waits, "a pass of the queue to find no room", 30)
        await asyncio.sleep(2.5)  # two more passes
        assert on_loop == []


@pytest.mark.slow
async def test_a_job_whose_pool_left_the_config_is_cancelled_and_gives_its_slices_back(
    tmp_path,
):
    async with running_service(tmp_path / "svc", simulate="1xA100-80GB") as svc:
        jobs = svc.app.jobs
        await jobs._loop.stop()  # noqa: SLF001 - the test places and starts the job itself
        alice = svc.create_user("alice")
        r = await svc.request("POST", "/jobs", alice, json={"code": "print(1)", "gpu_milli": 1000})
        assert r.status_code == 201, r.text
        job = r.json()
        # Running in pool "local", its slice held; then the pool leaves the config (as
        # after a restart with it removed).
        svc.app.ledger.allocate_gang("alice", "job", jobs.book.members(job))
        jobs.queue.start(job["id"], "local", "local")
        backend = jobs.book.backends.pop("local")
        try:
            r = await svc.request("DELETE", f"/jobs/{job['id']}", alice)
            assert r.status_code == 200, r.text
            ended = r.json()
            assert ended["state"] == "cancelled"
            assert ended["message"] == (
                "cancelled by its owner; its pool 'local' is no longer configured, so "
                "gpulab could not stop its processes"
            )
            assert svc.app.ledger.list(owner_kind="job") == []
        finally:
            jobs.book.backends["local"] = backend
