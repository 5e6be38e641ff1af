"""The job manager: the facade the routes and the other rooms call, over its parts.

One loop (every second, or sooner when woken) does four things: the poller
(:mod:`.poller`) asks each running job's backend how it is (ended ones release
their slices; preempted ones go back to the queue), preemption
(:mod:`.preemption`) places the claims it made room for, admission
(:mod:`.admission`) starts queued jobs in order (and makes room for the head when
its class may preempt), and elastic jobs grow into free slices (:mod:`.elastic`).

The parts, each given what it works with, by name: the rows, directories and
backends they all share (:mod:`.book`), where a job may run (:mod:`.places`), a
submit checked and queued (:mod:`.intake`), how a job ends or is requeued
(:mod:`.stops`), moves and restarts (:mod:`.moves`), the dashboard's progress
(:mod:`.progress`), and jobs across a restart of the service (:mod:`.adoption`):
state lives in the database and in each job's directory, so a restarted service
re-attaches to jobs whose torchrun is still running and learns how the others ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping

from gpulab.backend.base import Backend
from gpulab.backend.jobdir import MAX_RESTARTS, JobDir
from gpulab.db.jobs import TERMINAL
from gpulab.scheduler.ledger import OWNER_KINDS
from gpulab.service.jobs.admission import JobAdmission, QueueOrder
from gpulab.service.jobs.adoption import JobAdoption
from gpulab.service.jobs.backends import job_backends
from gpulab.service.jobs.book import JobBook, JobLimits, JobRefused
from gpulab.service.jobs.cpu_quota import CpuQuota
from gpulab.service.jobs.elastic import Resizes
from gpulab.service.jobs.intake import SERVICE_FIELDS, JobIntake
from gpulab.service.jobs.lineage import JobLineage
from gpulab.service.jobs.moves import JobMoves
from gpulab.service.jobs.places import JobPlaces
from gpulab.service.jobs.poller import JobPoller
from gpulab.service.jobs.preemption import Preemption
from gpulab.service.jobs.progress import JobProgress
from gpulab.service.jobs.stops import JobStops
from gpulab.service.tasks import KeptTask, wait_for_wake
from gpulab.service.telemetry.allreduce import AllreduceRecords

log = logging.getLogger("gpulab.service.jobs.manager")

__all__ = ["SERVICE_FIELDS", "JobLimits", "JobManager", "JobRefused"]

TICK_S = 1.0
#: How long stop() lets a pass of the loop finish before cutting it short.
STOP_GRACE_S = 10.0


class JobManager:
    """The job queue and its loop: jobs checked and stored, placed in order, started on
    their pool's backend, watched, ended. Built from what it works with (:meth:`of`
    names it from the service's); each part is built here, after the parts it
    calls, and none holds this manager or a part that holds it back."""

    def __init__(
        self,
        *,
        ledger,
        pools,
        root: str,
        backends: dict[str, Backend],
        priorities,
        granted_classes: Callable[[str], Awaitable[set[str]]],
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
        group_settings: Callable[[], Awaitable[dict]],
        over_quota: Callable[[str, int, int, str], str | None],
        record_probe: Callable[[dict, JobDir], object],
        limits: JobLimits,
        grace_seconds: float,
        pool_of_kind: Mapping[str, str],
        hibernations=None,
        record_run: Callable[[dict, JobDir, str], object] | None = None,
        refuse_over_budget: Callable[[str, int], Awaitable[None]] | None = None,
    ):
        #: The site's caps on one job (fine-tuning checks a job's size against them).
        self.limits = limits
        book = self.book = JobBook(
            ledger=ledger,
            pools=pools,
            root=root,
            backends=backends,
            order=QueueOrder(
                priorities=priorities,
                engine=ledger.engine,
                half_life_seconds=limits.fair_share_half_life_seconds,
            ),
            over_quota=over_quota,
        )
        self.places = JobPlaces(book)
        self.progress = JobProgress(book)
        self.stops = JobStops(
            book=book,
            places=self.places,
            grace_seconds=grace_seconds,
            record_probe=record_probe,
            record_run=record_run,
        )
        #: Elastic jobs' resizes (grow, shrink, go on after a failed node).
        self.resizes = Resizes(
            book=book,
            stops=self.stops,
            places=self.places,
            priorities=priorities,
            groups_of=groups_of,
            grow_after_s=limits.elastic_grow_after_seconds,
            grace_s=grace_seconds,
        )
        #: Frees slices for servers, endpoints and jobs of a higher class by stopping
        #: (or shrinking) running jobs; the deployment manager uses it too.
        self.preemption = Preemption(
            ledger=ledger,
            priorities=priorities,
            grace_seconds=grace_seconds,
            group_settings=group_settings,
            groups_of=groups_of,
            pools=pool_of_kind,
            book=book,
            stops=self.stops,
            resizes=self.resizes,
            hibernations=hibernations,
        )
        self.intake = JobIntake(
            book=book,
            places=self.places,
            priorities=priorities,
            granted_classes=granted_classes,
            groups_of=groups_of,
            limits=limits,
            refuse_over_budget=refuse_over_budget,
        )
        self.admission = JobAdmission(
            book=book,
            places=self.places,
            stops=self.stops,
            resizes=self.resizes,
            preemption=self.preemption,
            priorities=priorities,
            groups_of=groups_of,
        )
        self.poller = JobPoller(book=book, stops=self.stops, resizes=self.resizes)
        self.moves = JobMoves(book=book, stops=self.stops, priorities=priorities)
        self.adoption = JobAdoption(book=book, admission=self.admission, stops=self.stops)
        #: Each job's code hash and the datasets its ranks read (a model's lineage).
        self.lineage = JobLineage()
        self._loop = KeptTask("gpulab-job-queue", self.loop)

    @classmethod
    def of(cls, service) -> JobManager:
        """The service's job manager, from its settings and parts. Its backends are
        built here, before the service listens: bad settings stop the start."""
        root = os.path.join(service.data_dir, "jobs")
        os.makedirs(root, exist_ok=True)
        placing = service.inventory_settings
        return cls(
            ledger=service.ledger,
            pools=service.site_pools,
            root=root,
            backends=job_backends(service, root),
            priorities=service.priorities,
            granted_classes=service.hub_groups.granted_classes,
            groups_of=service.hub_groups.groups_of,
            group_settings=service.hub_groups.refresh,
            over_quota=CpuQuota.of(service).over,
            record_probe=AllreduceRecords(placing.node_name, service.telemetry).from_job,
            record_run=service.run_recorder.record if service.run_recorder else None,
            limits=JobLimits(
                slice_sizes=tuple(placing.slice_sizes),
                max_job_ranks=service.job_queue.max_job_ranks,
                max_job_vars_mib=service.job_queue.max_job_vars_mib,
                max_queued_jobs_per_user=service.job_queue.max_queued_jobs_per_user,
                fair_share_half_life_seconds=service.job_queue.fair_share_half_life_seconds,
                elastic_grow_after_seconds=service.job_queue.elastic_grow_after_seconds,
            ),
            grace_seconds=service.job_queue.preemption_grace_seconds,
            pool_of_kind={kind: service.pool_for(kind) for kind in OWNER_KINDS},
            hibernations=service.hibernations,
            refuse_over_budget=service.budgets.refuse_over_budget,
        )

    # -- what the routes and other rooms read -----------------------------------------
    @property
    def queue(self):
        return self.book.queue

    @property
    def backends(self) -> dict[str, Backend]:
        return self.book.backends

    @property
    def root(self) -> str:
        return self.book.root

    def backend_of(self, job: dict) -> Backend | None:
        """The backend of the pool a job runs in (None while an ``auto`` job waits)."""
        return self.book.backend_of(job)

    def backend_for(self, job: dict) -> Backend:
        """The backend of a job's pool; LookupError if its pool is gone."""
        return self.book.backend_for(job)

    def jobdir(self, job: dict) -> JobDir:
        return self.book.jobdir(job)

    # -- running -----------------------------------------------------------------------
    async def start(self) -> None:
        """Once the service listens: re-attach to running jobs, then run the queue."""
        try:
            self.preemption.restore()
            await self.adoption.reattach()
        except Exception:
            log.exception("Re-attaching to jobs")
        self._loop.start()

    async def reattach(self) -> None:
        """After a restart: keep watching running jobs; start admitted ones never launched."""
        await self.adoption.reattach()

    async def loop(self) -> None:
        book = self.book
        while True:
            # Cleared before the pass: a submit during it wakes the next one at once.
            book.wake.clear()
            try:
                async with book.lock:
                    await self.poller.poll_running()
                    await self.preemption.settle()
                    await self.admission.admit()
                    await self.resizes.grow()
            except Exception:  # the loop must outlive one bad job or a hub hiccup
                log.exception("job loop")
            await wait_for_wake(book.wake, TICK_S)

    async def suspend(self, grace_s: float) -> None:
        """The platform stops with its jobs (``gpulab up``'s Ctrl-C): end the loop,
        ask every running job to save a checkpoint at its next step and stop, kill
        what still runs after ``grace_s``, and queue each again: it resumes from its
        checkpoint at the next start."""
        async with self.book.lock:
            await self._loop.stop()
            await self.adoption.suspend(grace_s)

    async def stop(self) -> None:
        """End the queue loop between passes (jobs themselves run on: a restarted
        service re-attaches to them), then close the backends' API clients."""
        try:
            await asyncio.wait_for(self.book.lock.acquire(), STOP_GRACE_S)
            held = True
        except TimeoutError:
            held = False  # a pass is stuck (a hung backend call): cut it short
        try:
            await self._loop.stop()
        finally:
            if held:
                self.book.lock.release()
        for backend in self.book.backends.values():  # a cluster's holds a client
            try:
                await backend.close()
            except Exception:
                log.exception("Closing the %s backend", backend.name)

    # -- reading -----------------------------------------------------------------------
    def view(self, job: dict, positions: dict[str, int] | None = None) -> dict:
        """The job as the API shows it (``positions``: the queue's, when the caller
        shows many jobs and so orders the queue once)."""
        book = self.book
        jd = book.jobdir(job)
        out = dict(job)
        # Whom a job is stopped for stays the service's: the owner sees that it is.
        out["preempting"] = bool(job.get("preempting"))
        out["world_size"] = job["nodes"] * job["nproc_per_node"]
        # An elastic job's size now (0 while it waits), and how it changed.
        out["nodes_running"] = job["nodes"] if job["state"] == "running" else 0
        out["elastic"] = Resizes.elastic(job)
        out["resizing"] = bool(job.get("resizing"))
        if job["state"] != "queued":
            out["position"] = None
        else:
            out["position"] = (positions or book.queue.positions()).get(job["id"])
        out["has_out"] = bool(jd.out_path())
        if job.get("restarts"):
            # Where each restart resumed: a checkpoint's step, or None (step 0, none yet).
            told = jd.restart_steps()
            # A row from before MAX_RESTARTS held what a rank wrote: bounded here too.
            shown = min(int(job["restarts"]), MAX_RESTARTS)
            out["restarted_from"] = [told.get(n) for n in range(1, shown + 1)]
        out.update(self.lineage.of(job, jd))
        if not out.get("pool"):
            found = book.pools.of_kind(job["backend"])
            out["pool"] = found.name if found else job["backend"]
        slurm_job_id = getattr(book.backend_of(job), "slurm_job_id", None)
        if slurm_job_id is not None and job["state"] != "queued":
            out["slurm_job_id"] = slurm_job_id(job["id"])  # for squeue and sacct
        return out

    def lineage_of(self, job_id: str) -> dict | None:
        """``{"id", "user", "state", "code_hash", "datasets"}`` of a job, or None."""
        job = self.book.queue.get(job_id)
        if job is None:
            return None
        return {
            "id": job["id"],
            "user": job["user"],
            "state": job["state"],
            **self.lineage.of(job, self.book.jobdir(job)),
        }

    def summaries(self, user: str | None) -> list[dict]:
        """Queued and running jobs with their latest step, loss and throughput.

        For the dashboard's Jobs tab; ``user=None`` means every user's (admins).
        """
        return self.progress.summaries(user)

    # -- changing ----------------------------------------------------------------------
    async def submit(self, who, body: dict) -> dict:
        """Check and queue a job (:class:`JobRefused` says why not); its view."""
        job = await self.intake.submit(who, body)
        # In a thread: a queued job's position orders the queue (every user's decayed use).
        return await asyncio.to_thread(self.view, job)

    async def cancel(self, job: dict, reason: str = "cancelled") -> dict:
        book = self.book
        async with book.lock:
            job = book.queue.get(job["id"])
            if job["state"] in TERMINAL:
                return self.view(job)
            spec = book.spec(job)
            backend = book.backend_of(job)
            if job["state"] == "running" and backend is None:
                # Its pool left the config: nothing here can reach its processes, but
                # the job still ends and its slices go back.
                reason += (
                    f"; its pool {job.get('pool') or job['backend']!r} is no longer "
                    f"configured, so gpulab could not stop its processes"
                )
            elif job["state"] == "running":
                await backend.cancel(spec)
            await self.stops.end(job, spec, "cancelled", reason)
        return self.view(book.queue.get(job["id"]))

    async def move(self, job_id: str, what: str, why: str) -> bool:
        """Checkpoint a running job and requeue it, e.g. off a cordoned GPU
        (:meth:`.moves.JobMoves.move`). False if it is not running or already stopping."""
        return await self.moves.move(job_id, what, why)

    async def restart(self, job_id: str, what: str, why: str) -> bool:
        """Stop a running job's processes now and requeue it, e.g. one that stalled.
        False if it is not running."""
        return await self.moves.restart(job_id, what, why)
