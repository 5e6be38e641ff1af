"""Queued jobs started in order: the queue's order (:class:`QueueOrder`), each pass's
admission (:meth:`JobAdmission.admit`), preemption for the head of the queue when
it finds no room and its class may, and the start itself on the pool's backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpulab.db.usage import UsageStore
from gpulab.scheduler.slices import noun, plural
from gpulab.service.jobs.book import JobBook, elastic
from gpulab.service.jobs.elastic import Resizes, nodes_word
from gpulab.service.jobs.places import JobPlaces
from gpulab.service.jobs.preemption import Preemption, article
from gpulab.service.jobs.stops import JobStops

log = logging.getLogger("gpulab.service.jobs.admission")


class QueueOrder:
    """Class, then the job's priority, then its owner's decayed use, then submit time
    (the queue calls it with the queued rows; it returns their sort key)."""

    def __init__(self, *, priorities, engine, half_life_seconds: float):
        self.priorities = priorities
        self.engine = engine
        self.half_life_seconds = half_life_seconds

    def __call__(self, queued: list[dict]) -> Callable[[dict], tuple]:
        priorities = self.priorities
        use = (
            UsageStore(self.engine).decayed(self.half_life_seconds)
            if len({j["user"] for j in queued}) > 1
            else {}
        )
        return lambda j: (
            -priorities.value(j["priority_class"], "job"),
            -j["priority"],
            round(use.get(j["user"], 0.0)),
            j["submitted"],
            j["id"],
        )


class JobAdmission:
    """Starts what the queue admits, on ``book``'s backends; asks ``preemption`` to
    make room for a blocked head, and starts the job once its claim is placed."""

    def __init__(
        self,
        *,
        book: JobBook,
        places: JobPlaces,
        stops: JobStops,
        resizes: Resizes,
        preemption: Preemption,
        priorities,
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
    ):
        self.book = book
        self.places = places
        self.stops = stops
        self.resizes = resizes
        self.preemption = preemption
        self.priorities = priorities
        self.groups_of = groups_of
        # Registered once, here: the only link from preemption back to the jobs.
        preemption.on_placed["job"] = self.claim_placed

    async def admit(self) -> None:
        """One pass: start every queued job that fits, in order; make room for the
        first that does not."""
        book = self.book
        # Only who waits, unordered and off the event loop: ordering reads every
        # user's decayed use, and admit() orders them again in its thread anyway.
        queued = await asyncio.to_thread(book.queue.list, states=("queued",))
        if not queued:
            return
        groups = {u: await self.groups_of(u) for u in {j["user"] for j in queued}}
        admitted, blocked = await book.ledger.aio.run(
            book.queue.admit, book.ledger, groups, book.members, places=self.places.places
        )
        for job, rows in admitted:
            await self.start(job, rows)
        if blocked is not None and blocked["gpu_milli"]:
            await self._make_room_for(blocked)

    async def start(self, job: dict, rows: list[dict]) -> None:
        """Launch an admitted job on its pool's backend with its slices ``rows``."""
        book = self.book
        spec = book.spec(job)
        self.places.forget(job["id"])
        rows = await self.resizes.extend(job, spec, rows)
        where = sorted({f"{r['node']}:{r['gpu_index']}" for r in rows})
        pool = f" in pool {job['pool']}" if job.get("pool") and len(book.pools.list) > 1 else ""
        why = job["message"].split(": ", 1)[1] if job["message"].startswith("starting on") else ""
        on = f"{nodes_word(spec.nodes)} of {job['max_nodes']}, " if elastic(job) else ""
        book.jobdir(job).event(
            f"job started{pool}: {on}{plural(spec.world_size, 'rank')}"
            + (f" on {noun(len(where), 'GPU')} {', '.join(where)}" if where else " on CPU")
            + (f" ({why})" if why else "")
        )
        try:
            await book.backend_for(job).start(spec, rows)
        except Exception as e:
            log.exception("Starting job %s", job["id"])
            await self.stops.end(job, spec, "failed", f"could not start: {e}")

    async def _make_room_for(self, job: dict) -> None:
        """The head of the queue found no room: preempt for it, in the first pool it
        may run in, if its class may."""
        priorities = self.priorities
        klass = priorities.by_name.get(job["priority_class"]) or priorities.of_kind("job")
        pools = self.places.candidates(job)
        if not pools:
            return
        claim = await self.preemption.make_room(
            "job",
            job["user"],
            self.book.members(job),
            klass.value,
            f"{article(klass.name)} job",
            pools[0],
        )
        if claim is not None:
            await asyncio.to_thread(self.book.queue.update, job["id"], message=claim.message())

    async def claim_placed(self, claim, rows: list[dict]) -> None:
        """Preemption placed a job's claim (in the loop, the lock held): start it."""
        book = self.book
        job = await asyncio.to_thread(book.queue.get, claim.members[0][0].split("/", 1)[0])
        if job is None or job["state"] != "queued":  # cancelled meanwhile
            for owner, _ in claim.members:
                await book.ledger.aio.release("job", owner)
            return
        pool = claim.pool or (self.places.candidates(job) or [""])[0]
        kind = book.pools.by_name[pool].kind if pool in book.pools.by_name else ""
        await asyncio.to_thread(book.queue.start, job["id"], pool, kind)
        await self.start(await asyncio.to_thread(book.queue.get, job["id"]), rows)
