"""Moving a running job (self-healing): off a cordoned GPU with a checkpoint, or
restarted at once when it stalled. The preemption path, with a claim for the
job itself, so it is placed again (where placement allows) once it has stopped.
"""

from __future__ import annotations

import asyncio
import time

from gpulab.service.jobs.book import JobBook
from gpulab.service.jobs.preemption import Claim
from gpulab.service.jobs.stops import JobStops


class JobMoves:
    """Moves and restarts of ``book``'s running jobs, through ``stops``."""

    def __init__(self, *, book: JobBook, stops: JobStops, priorities):
        self.book = book
        self.stops = stops
        self.priorities = priorities

    async def move(self, job_id: str, what: str, why: str) -> bool:
        """Checkpoint a running job at its next step and requeue it, e.g. off a cordoned
        GPU. ``what`` ends "preempted for ..."; ``why`` is the one line its event log and
        message start with. Backends that cannot be preempted are restarted
        (:meth:`restart`). False if it is not running or already stopping."""
        book = self.book
        async with book.lock:
            job = book.queue.get(job_id)
            backend = book.backend_of(job) if job is not None else None
            if backend is None or job["state"] != "running" or job["preempting"]:
                return False
            if not backend.can_preempt:
                await self._restart(job, what, why)
                return True
            klass = self.priorities.by_name.get(job["priority_class"])
            value = (klass or self.priorities.of_kind("job")).value
            grace = self.stops.grace_seconds
            claim = Claim(
                "job",
                job["user"],
                book.members(job),
                value,
                what,
                [job_id],
                time.time() + grace,
                job.get("pool") or "",
            )
            book.jobdir(job).event(f"{why}; the job saves a checkpoint and moves")
            book.claims[claim.key] = claim
            await self.stops.preempt(job_id, claim)
            await asyncio.to_thread(
                book.queue.update,
                job_id,
                message=f"{why}; saving a checkpoint at the next step to move (grace {grace:g} s)",
            )
            return True

    async def restart(self, job_id: str, what: str, why: str) -> bool:
        """Stop a running job's processes now and requeue it (it resumes from its latest
        checkpoint), e.g. one that stalled. False if it is not running."""
        book = self.book
        async with book.lock:
            job = book.queue.get(job_id)
            if job is None or job["state"] != "running" or book.backend_of(job) is None:
                return False
            await self._restart(job, what, why)
            return True

    async def _restart(self, job: dict, what: str, why: str) -> None:
        spec = self.book.spec(job)
        self.book.jobdir(job).event(f"{why}; stopping its processes to restart it")
        await self.book.backend_for(job).cancel(spec)
        await self.stops.requeue(job, spec, what)
