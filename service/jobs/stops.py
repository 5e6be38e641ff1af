"""How a job stops: it ends (its slices go back, its row says how), or it is asked
to save a checkpoint and stop (preemption, a move, gpulab's own stop) and goes
back to the queue to resume.

Every other part of the job manager that stops a job calls this one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import JobSpec
from gpulab.db.jobs import TERMINAL
from gpulab.scheduler.queue import PREEMPTED
from gpulab.service.jobs.book import JobBook, elastic
from gpulab.service.jobs.places import JobPlaces

log = logging.getLogger("gpulab.service.jobs.stops")


class JobStops:
    """Ending jobs and sending them back to the queue, on ``book``'s rows."""

    def __init__(
        self,
        *,
        book: JobBook,
        places: JobPlaces,
        grace_seconds: float,
        record_probe: Callable[[dict, JobDir], object],
        record_run: Callable[[dict, JobDir, str], object] | None = None,
    ):
        self.book = book
        self.places = places
        #: How long a job asked to stop gets to save its checkpoint.
        self.grace_seconds = grace_seconds
        #: A succeeded job's all-reduce probe result, recorded for the dashboard.
        self.record_probe = record_probe
        #: An ended job written as its user's MLflow run (service/experiments/), or None.
        self.record_run = record_run

    # -- ending ------------------------------------------------------------------------
    def finish(
        self, job: dict, owners: list[str], state: str, message: str, values: dict
    ) -> int | None:
        """The job's slices go back, then its row ends (in the ledger's threads: SQLite
        may wait for another writer). In that order, a reader who sees the job ended
        finds its slices free. None if the job had already ended."""
        released = sum(len(self.book.ledger.release("job", o)) for o in owners)
        if not self.book.queue.finish(job["id"], state, message, **values):
            return None
        return released

    async def end(self, job: dict, spec: JobSpec, state: str, message: str, **values) -> None:
        """End a job: ``state`` with ``message``; its slices go back."""
        book = self.book
        current = await asyncio.to_thread(book.queue.get, job["id"])
        if current is not None and current["state"] not in TERMINAL:
            # Before the row ends: a reader following the log stops once it sees the
            # end, and must find this line there.
            # The message once, not "job succeeded: succeeded".
            said = f": {message}" if message and message != state else ""
            book.jobdir(job).event(f"job {state}{said}")
        released = await book.ledger.aio.run(
            self.finish, job, spec.rank_owners(), state, message, values
        )
        if released is not None:
            try:  # a job that ended starts no rank again: its variables are not needed
                await asyncio.to_thread(book.jobdir(job).drop_variables)
            except OSError as e:
                log.warning("Job %s: could not remove its variables: %s", job["id"], e)
            if state == "succeeded":  # a nettest probe's result, read from the job itself
                self.record_probe(job, book.jobdir(job))
            if self.record_run is not None:  # in the background: MLflow may be slow
                self.record_run(book.queue.get(job["id"]) or job, book.jobdir(job), state)
            log.info(
                "Job %s of %s %s (%s); released %d slice(s)",
                job["id"],
                job["user"],
                state,
                message,
                released,
            )
            book.wake.set()

    # -- stopping to resume --------------------------------------------------------------
    async def preempt(self, job_id: str, claim) -> None:
        """Ask a running job to checkpoint and stop for ``claim`` (within the grace)."""
        book = self.book
        job = await asyncio.to_thread(book.queue.get, job_id)
        grace = self.grace_seconds
        await asyncio.to_thread(
            book.queue.update,
            job_id,
            preempting={"claim": claim.to_json(), "deadline": claim.deadline},
            message=(
                f"preempting: saving a checkpoint at the next step to make room for "
                f"{claim.what} (grace {grace:g} s)"
            ),
        )
        spec = book.spec(job)
        book.jobdir(job).event(
            f"preempted for {claim.what}: SIGTERM to every rank; they save a checkpoint "
            f"at the next step and stop (grace {grace:g} s), then the job waits in the queue"
        )
        await book.backend_for(job).preempt(spec)

    async def kill_now(self, job: dict, spec: JobSpec) -> None:
        """What still runs after its grace (SIGTERM was that grace)."""
        await self.book.backend_for(job).cancel(spec, grace_s=0.5)

    async def settle_stopped(self, job: dict, spec: JobSpec, status, what: str) -> None:
        """A job asked to stop (for ``what``) has: ended if it finished within the
        grace period (nothing to resume), else queued again to resume."""
        if status.state == "succeeded" and self.book.jobdir(job).preempted_at() is None:
            await self.end(job, spec, "succeeded", "succeeded", restarts=status.restarts)
            return
        await self.requeue(job, spec, what)

    async def requeue(self, job: dict, spec: JobSpec, what: str) -> None:
        """Its slices go back and it waits in the queue again, to resume from its latest
        checkpoint; ``what`` it stopped for ends the message "preempted for ..."."""
        book = self.book
        jd = book.jobdir(job)
        latest = jd.checkpoint()
        resume = (
            f"resumes from its checkpoint at step {latest['step']}"
            if latest
            else "it had no checkpoint yet and starts over"
        )
        message = f"{PREEMPTED}{what}; waits in the queue and {resume}"

        def requeue() -> None:
            for owner in spec.rank_owners():
                book.ledger.release("job", owner)
            book.queue.update(
                job["id"],
                state="queued",
                started=None,
                preempting=None,
                resizing=None,
                preemptions=job["preemptions"] + 1,
                message=message,
                **back_to,
            )

        back_to = self.places.requested(job)
        if elastic(job):  # it waits for MIN nodes again
            back_to["nodes"] = job["min_nodes"]
            spec.nodes = job["min_nodes"]
            jd.write_spec(spec.to_dict())
        jd.reset_run()
        await book.ledger.aio.run(requeue)
        jd.event(message)
        log.info("Job %s of %s preempted (%s)", job["id"], job["user"], message)
        book.wake.set()
