"""Jobs across a restart of the service: at its start it re-attaches to the jobs
whose ranks still run (and launches admitted ones that never were); at
``gpulab up``'s stop, jobs save a checkpoint and wait in the queue for the next
start. State lives in the database and in each job's directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from gpulab.service.jobs.admission import JobAdmission
from gpulab.service.jobs.book import JobBook
from gpulab.service.jobs.stops import JobStops

log = logging.getLogger("gpulab.service.jobs.adoption")


class JobAdoption:
    """Re-attaching to ``book``'s running jobs, and suspending them; ``admission``
    launches what was admitted but never started, ``stops`` requeues."""

    def __init__(self, *, book: JobBook, admission: JobAdmission, stops: JobStops):
        self.book = book
        self.admission = admission
        self.stops = stops

    async def reattach(self) -> None:
        """After a restart: keep watching running jobs; start admitted ones never launched."""
        book = self.book
        for job in book.queue.list(states=("running",)):
            backend = book.backend_of(job)
            if backend is None:
                continue
            spec = book.spec(job)
            if not os.path.exists(backend.jobdir(job["id"]).p("launch.json")):
                rows = [
                    r
                    for o in spec.rank_owners()
                    for r in book.ledger.list(owner_kind="job", owner=o)
                ]
                await self.admission.start(job, rows)
                continue
            alive = await backend.reattach(spec)
            log.info("Job %s: %s", job["id"], "re-attached" if alive else "ended while away")

    async def suspend(self, grace_s: float) -> None:
        """Ask every running job to save a checkpoint at its next step and stop, kill
        what still runs after ``grace_s``, and queue each again. Call with the book's
        lock held and the job loop stopped."""
        book, stops = self.book, self.stops
        running = [j for j in book.queue.list(states=("running",)) if book.backend_of(j)]
        if not running:
            return
        specs = {j["id"]: book.spec(j) for j in running}
        for job in running:
            book.jobdir(job).event(
                "gpulab is stopping: SIGTERM to every rank; they save a checkpoint "
                "at the next step, and the job resumes at gpulab's next start"
            )
            if book.backend_for(job).can_preempt:
                await book.backend_for(job).preempt(specs[job["id"]])
        deadline = time.monotonic() + grace_s
        status, left = {}, running
        while left:  # polled once at least: every job's state is known below
            await asyncio.sleep(0.1)
            for j in left:
                status[j["id"]] = await book.backend_for(j).poll(specs[j["id"]])
            left = [j for j in left if status[j["id"]].state == "running"]
            if time.monotonic() >= deadline:
                break
        # Whatever missed the grace loses the steps since its last checkpoint.
        await asyncio.gather(*(stops.kill_now(j, specs[j["id"]]) for j in left))
        for job in running:
            await stops.settle_stopped(job, specs[job["id"]], status[job["id"]], "gpulab's stop")
        log.info("Stopped %d running job(s) until gpulab's next start", len(running))
