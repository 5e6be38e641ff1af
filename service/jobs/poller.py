"""Each running job's state, asked of its backend in every pass of the job loop:
ended ones end (their slices go back), ones asked to stop are requeued once they
have, elastic ones being resized are relaunched, and ones past ``--timeout`` are
stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time

from gpulab.backend.spec import JobSpec
from gpulab.db import clock
from gpulab.service.jobs.book import JobBook, elastic
from gpulab.service.jobs.elastic import Resizes
from gpulab.service.jobs.stops import JobStops

log = logging.getLogger("gpulab.service.jobs.poller")


class JobPoller:
    """Polls ``book``'s running jobs; ``stops`` ends or requeues them, ``resizes``
    carries elastic ones through a resize."""

    def __init__(self, *, book: JobBook, stops: JobStops, resizes: Resizes):
        self.book = book
        self.stops = stops
        self.resizes = resizes

    async def poll_running(self) -> None:
        book = self.book
        for job in book.queue.list(states=("running",)):
            try:
                await self._poll_one(job)
            except Exception as e:  # one broken job must not stop the others
                log.exception("Polling job %s", job["id"])
                if book.backend_of(job) is None or not os.path.exists(
                    book.jobdir(job).p("spec.json")
                ):
                    most = job.get("max_nodes") or job["nodes"]
                    owners = [f"{job['id']}/{r}" for r in range(most * job["nproc_per_node"])]
                    await book.ledger.aio.run(
                        self.stops.finish, job, owners, "failed", f"lost its job directory: {e}", {}
                    )

    async def _poll_one(self, job: dict) -> None:
        book, stops = self.book, self.stops
        spec = book.spec(job)
        backend = book.backend_for(job)
        status = await backend.poll(spec)
        if elastic(job):  # its failures are the service's to count, not torchrun's
            status.restarts = job["restarts"]
        if job["preempting"]:
            await self._poll_preempting(job, spec, status)
            return
        if job.get("resizing"):
            await self.resizes.poll(job, spec, status)
            return
        if await self.resizes.after_failure(job, spec, status):
            return
        if status.restarts != job["restarts"]:
            book.queue.update(job["id"], restarts=status.restarts)
        if status.state == "running":
            if "kueue" in status.details:
                # Kueue's word while the job waits for quota or after a preemption
                # (the Kubernetes backend reads its Workload); "running" once admitted.
                shown = status.message or "running"
                if job["message"] != shown:
                    book.queue.update(job["id"], message=shown)
            elif job["message"] == "starting":
                book.queue.update(job["id"], message="running")
            if spec.timeout and job["started"] and _age(job) > spec.timeout:
                await backend.cancel(spec)
                await stops.end(
                    job,
                    spec,
                    "failed",
                    f"timed out after {spec.timeout:g} s (--timeout)",
                    restarts=status.restarts,
                )
            return
        await stops.end(
            job,
            spec,
            status.state,
            status.message or status.state,
            error=status.error,
            restarts=status.restarts,
        )

    async def _poll_preempting(self, job: dict, spec: JobSpec, status) -> None:
        """A job asked to stop: requeue it once it has (or kill it after the grace)."""
        claim = job["preempting"]["claim"]
        if status.state == "running":
            if time.time() > job["preempting"]["deadline"]:
                self.book.jobdir(job).event("the grace period ended: stopping what is left")
                await self.book.backend_for(job).cancel(spec)
                await self.stops.requeue(job, spec, claim["what"])
            return
        await self.stops.settle_stopped(job, spec, status, claim["what"])


def _age(job: dict) -> float:
    started = dt.datetime.fromisoformat(job["started"])
    return (clock.utcnow() - started).total_seconds()
