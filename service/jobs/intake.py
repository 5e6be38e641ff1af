"""A job submitted: checked against the site's caps, its class and its owner's
quotas, stored with its inputs in a directory of its own, and queued.

What is refused is refused here, with the HTTP status to answer with
(:class:`~.book.JobRefused`), never later in the queue.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable

from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import JobSpec, SpecError, SpecTooLarge
from gpulab.db.jobs import QueueFull
from gpulab.scheduler.budget import BudgetExceeded
from gpulab.scheduler.priority import PriorityError
from gpulab.scheduler.queue import never_fits
from gpulab.scheduler.slices import SliceError, label, noun, parse_gpu_milli, plural
from gpulab.service.jobs.book import JobBook, JobLimits, JobRefused
from gpulab.service.jobs.places import JobPlaces
from gpulab.service.jobs.pools import AUTO

#: Fields of a job spec the service fills in; a client may not send them.
SERVICE_FIELDS = ("id", "user", "checkpoint_dir")


class JobIntake:
    """Submits checked and queued in ``book``, in the pools ``places`` finds."""

    def __init__(
        self,
        *,
        book: JobBook,
        places: JobPlaces,
        priorities,
        granted_classes: Callable[[str], Awaitable[set[str]]],
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
        limits: JobLimits,
        refuse_over_budget: Callable[[str, int], Awaitable[None]] | None = None,
    ):
        self.book = book
        self.places = places
        self.priorities = priorities
        self.granted_classes = granted_classes
        self.groups_of = groups_of
        self.limits = limits
        #: Raises :class:`BudgetExceeded` when the user (or a group of theirs) has used
        #: its GPU-hours and asks for a GPU; None: no budgets.
        self.refuse_over_budget = refuse_over_budget

    async def submit(self, who, body: dict) -> dict:
        """The queued job's row; :class:`JobRefused` with the reason otherwise."""
        if who.kind != "user":
            raise JobRefused(403, "jobs are submitted by users (with a user's token)")
        # Here, not in the route: scheduled runs and fine-tuning jobs come this way too.
        await self._check_budget(who.name, body)
        self._refuse_service_fields(body)
        # At the cap, before the body's variables are decoded and written (the insert
        # checks again, in its own transaction).
        await self._check_queue(who.name)
        spec, klass = await self.checked_spec(who, body)
        # An elastic job waits for MIN nodes; the service sets its size at each launch.
        spec.nodes = spec.least_nodes
        # The backends' checks may name the job (a Kubernetes Job's name is its id).
        spec.id = uuid.uuid4().hex[:12]
        spec.user = who.name
        book = self.book
        places = self.places.places_for(spec)
        total = spec.gpu_milli * spec.world_size
        groups = await self.groups_of(who.name)
        reason = never_fits(book.ledger.quotas, who.name, total, groups)
        if not reason and all(book.backends[p.name].runs_on_this_host for p in places):
            # The quota is this host's; Slurm and Kubernetes nodes have their own.
            reason = book.over_quota(who.name, spec.world_size, spec.gpu_milli, "ranks")
        if reason:
            raise JobRefused(403, reason)
        pool = places[0].name if len(places) == 1 else AUTO

        jd = JobDir(book.root, spec.id)
        os.makedirs(jd.path)
        spec.checkpoint_dir = jd.p("checkpoints")
        await asyncio.to_thread(jd.write_inputs, spec)  # the variables decoded and written
        try:
            job = self._queue(spec, klass, places, pool)
        except QueueFull as e:
            await asyncio.to_thread(shutil.rmtree, jd.path, True)
            raise self._queue_full(e.args[0]) from None
        where = (
            f"pool {pool}" if pool != AUTO else f"the first pool with room ({book.pools.names()})"
        )
        size = (
            f"{spec.min_nodes} to {spec.max_nodes} nodes of {plural(spec.nproc_per_node, 'rank')}"
            if spec.elastic
            else plural(spec.world_size, "rank")
        )
        jd.event(f"job {spec.id} queued: {size} x {label(spec.gpu_milli)}, for {where}")
        book.wake.set()
        return job

    async def check_room(self, who, body: dict) -> None:
        """What a submit of ``body`` now would be refused for before its spec is read:
        the owner's GPU-hour budget and their cap of waiting jobs. A caller that builds
        a large body (a fine-tuning job reads the base model into it) asks first."""
        await self._check_budget(who.name, body)
        await self._check_queue(who.name)

    async def checked_spec(self, who, body: dict):
        """``(spec, priority class)`` of ``body`` as ``who`` would submit it, by the
        checks that do not depend on the time (the spec, the slice size, the site's
        caps, the priority and its class): the same :class:`JobRefused` as a submit.
        A schedule is checked this way when it is made, not first at its run."""
        self._refuse_service_fields(body)
        try:
            # Its variables may be hundreds of MB of base64, checked here: in a thread.
            spec = await asyncio.to_thread(JobSpec.from_dict, dict(body))
            parse_gpu_milli(spec.gpu_milli, self.limits.slice_sizes)
        except SpecTooLarge as e:
            raise JobRefused(413, str(e)) from None
        except (SpecError, SliceError, TypeError) as e:
            raise JobRefused(400, str(e)) from None
        self._check_limits(spec)
        if spec.priority > 0 and not who.admin:
            raise JobRefused(
                403,
                f"priority {spec.priority}: users may lower their jobs' "
                f"priority (down to -100); raising it is for admins",
            )
        try:
            klass = self.priorities.for_job(
                spec.priority_class, who.admin, await self.granted_classes(who.name)
            )
        except PriorityError as e:
            status = 403 if spec.priority_class in self.priorities.by_name else 400
            raise JobRefused(status, str(e)) from None
        return spec, klass

    @staticmethod
    def _refuse_service_fields(body: dict) -> None:
        sent = sorted(set(body) & set(SERVICE_FIELDS))
        if sent:
            raise JobRefused(
                400,
                f"{noun(len(sent), 'field')} set by the service, not the client: {', '.join(sent)}",
            )

    async def _check_queue(self, user: str) -> None:
        waiting = await asyncio.to_thread(self.book.queue.queued_of, user)
        if waiting >= self.limits.max_queued_jobs_per_user:
            raise self._queue_full(waiting)

    async def _check_budget(self, user: str, body: dict) -> None:
        """Refuse GPU work to a user over their GPU-hour budget (any GPU costs hours)."""
        if self.refuse_over_budget is None:
            return
        try:
            milli = parse_gpu_milli(body.get("gpu_milli", 0))  # "1000" is 1000, as the job's
        except SliceError:
            milli = 0  # refused below with what is wrong with it
        try:
            await self.refuse_over_budget(user, milli)
        except BudgetExceeded as e:
            raise JobRefused(403, str(e)) from None

    def _queue_full(self, waiting: int) -> JobRefused:
        return JobRefused(
            429,
            f"you have {plural(waiting, 'job')} waiting in the queue, the most one user "
            f"may have here ({self.limits.max_queued_jobs_per_user}): wait for some to "
            f"start, or cancel those you no longer need (an admin can raise "
            f"c.JobQueue.max_queued_jobs_per_user)",
        )

    def _queue(self, spec: JobSpec, klass, places, pool: str) -> dict:
        """The job's row, queued: at most the owner's cap of waiting jobs."""
        return self.book.queue.add(
            {
                "id": spec.id,
                "user": spec.user,
                "name": spec.name,
                "priority": spec.priority,
                "priority_class": spec.priority_class,
                "preemptible": spec.preemptible and klass.preemptible,
                "backend": places[0].kind if len(places) == 1 else "",
                "pool": pool,
                "nodes": spec.nodes,
                "min_nodes": spec.min_nodes if spec.elastic else None,
                "max_nodes": spec.max_nodes if spec.elastic else None,
                "nproc_per_node": spec.nproc_per_node,
                "gpu_milli": spec.gpu_milli,
                "message": "queued",
            },
            most_queued=self.limits.max_queued_jobs_per_user,
        )

    def _check_limits(self, spec: JobSpec) -> None:
        """The site's caps: every rank is a process somewhere, GPU or not."""
        cap = self.limits.max_job_ranks
        ranks = spec.most_nodes * spec.nproc_per_node
        if ranks > cap:
            raise JobRefused(
                400,
                f"the job asks for {ranks} ranks ({plural(spec.most_nodes, 'node')} "
                f"x {spec.nproc_per_node}); at most {cap} per job "
                f"here: use fewer --nodes or --nproc-per-node (an admin can "
                f"raise c.JobQueue.max_job_ranks)",
            )
        limit = self.limits.max_job_vars_mib * 2**20
        if spec.vars_size > limit:
            raise JobRefused(
                413,
                f"the job's variables are {spec.vars_size / 2**20:.1f} MiB "
                f"(pickled), over the {self.limits.max_job_vars_mib} MiB a "
                f"job may carry; save large data to a file or dataset the "
                f"ranks read (an admin can raise "
                f"c.JobQueue.max_job_vars_mib)",
            )
