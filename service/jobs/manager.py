"""The job manager: the queue, the ledger and the backends, composed.

One loop (every second, or sooner when woken) does three things: it polls the
running jobs (ended ones release their slices; preempted ones go back to the
queue), it places the claims that preemption made room for
(:mod:`gpulab.service.jobs.preemption`), and it admits queued jobs in order
(:meth:`~gpulab.scheduler.queue.JobQueue.admit`), starting each on its
backend. When the job at the head finds no room and its class may preempt,
it makes room the same way a server does.

State lives in the database and in each job's directory, so a restarted
service re-attaches (:meth:`JobManager.reattach`) to jobs whose torchrun is
still running and learns how the others ended.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpulab.backend.base import Backend
from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import JobSpec, SpecError, SpecTooLarge
from gpulab.db import clock
from gpulab.db.jobs import TERMINAL
from gpulab.db.usage import decayed
from gpulab.scheduler.priority import PriorityError
from gpulab.scheduler.queue import PREEMPTED, JobQueue, Place, never_fits
from gpulab.scheduler.slices import MILLI_PER_GPU, SliceError, label, noun, parse_gpu_milli, plural
from gpulab.service.jobs.backends import NoLocalJobs, job_backends
from gpulab.service.jobs.cpu_quota import CpuQuota
from gpulab.service.jobs.elastic import Resizes, nodes_word
from gpulab.service.jobs.lineage import JobLineage
from gpulab.service.jobs.pools import AUTO, Pool, PoolRefused
from gpulab.service.jobs.preemption import Claim, Preemption, article
from gpulab.service.tasks import KeptTask, wait_for_wake
from gpulab.service.telemetry.allreduce import AllreduceRecords

log = logging.getLogger("gpulab.service.jobs.manager")

#: Fields of a job spec the service fills in; a client may not send them.
SERVICE_FIELDS = ("id", "user", "checkpoint_dir")
TICK_S = 1.0
#: How long stop() lets a pass of the loop finish before cutting it short.
STOP_GRACE_S = 10.0


class JobRefused(Exception):
    """Submit refused; ``status`` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class JobLimits:
    """The site's caps on one job (``c.GpuLabService`` settings of those names)."""

    slice_sizes: tuple[int, ...]
    max_job_ranks: int
    max_job_vars_mib: int
    fair_share_half_life_seconds: float
    #: Elastic jobs: how long one runs at a size before it may grow again.
    elastic_grow_after_seconds: float = 10.0


class JobManager:
    """The job queue and its loop: jobs checked and stored, placed in order, started on
    their pool's backend, watched, ended. Built from the parts it works with
    (:meth:`of` names them from the service's)."""

    def __init__(
        self,
        *,
        ledger,
        pools,
        root: str,
        backends: dict[str, Backend],
        preemption: Preemption,
        priorities,
        granted_classes: Callable[[str], Awaitable[set[str]]],
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
        over_quota: Callable[[str, int, int, str], str | None],
        record_probe: Callable[[dict, JobDir], object],
        limits: JobLimits,
        record_run: Callable[[dict, JobDir, str], object] | None = None,
    ):
        self.ledger = ledger
        self.queue = JobQueue(ledger.engine, self._order)
        #: Running jobs are its victims; it places its claims in our loop's passes.
        self.preemption = preemption
        preemption.attach(self, on_placed=self._claim_placed)
        self.root = root
        self.pools = pools
        #: Each pool's backend, by the pool's name.
        self.backends = backends
        self.priorities = priorities
        self.granted_classes = granted_classes
        self.groups_of = groups_of
        #: Why ranks of a user's job would not fit their CPU and memory quota, or None.
        self.over_quota = over_quota
        #: A succeeded job's all-reduce probe result, recorded for the dashboard.
        self.record_probe = record_probe
        #: An ended job written as its user's MLflow run (service/experiments/), or None.
        self.record_run = record_run
        self.limits = limits
        #: Jobs of an earlier local run on a site without a local pool now.
        self._legacy = NoLocalJobs(self.root)
        #: Held by a pass of the loop and by whatever changes the queue or stops jobs
        #: (preemption's choices too): one change at a time.
        self.lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tails: dict[str, tuple[int, list[dict]]] = {}
        #: Each job's code hash and the datasets its ranks read (a model's lineage).
        self.lineage = JobLineage()
        #: Queued ``auto`` jobs: the pools each may start in (from its spec, once).
        self._auto: dict[str, list[str]] = {}
        self._loop = KeptTask("gpulab-job-queue", self.loop)
        #: Elastic jobs' resizes (grow, shrink, go on after a failed node).
        self.resizes = Resizes(
            self,
            grow_after_s=limits.elastic_grow_after_seconds,
            grace_s=preemption.grace_seconds,
        )

    @classmethod
    def of(cls, service, preemption: Preemption) -> JobManager:
        """The service's job manager, from its settings and parts. Its backends are
        built here, before the service listens: bad settings stop the start."""
        root = os.path.join(service.data_dir, "jobs")
        os.makedirs(root, exist_ok=True)
        return cls(
            ledger=service.ledger,
            pools=service.site_pools,
            root=root,
            backends=job_backends(service, root),
            preemption=preemption,
            priorities=service.priorities,
            granted_classes=service.hub_groups.granted_classes,
            groups_of=service.hub_groups.groups_of,
            over_quota=CpuQuota.of(service).over,
            record_probe=AllreduceRecords(service.node_name, service.telemetry).from_job,
            record_run=service.run_recorder.record if service.run_recorder else None,
            limits=JobLimits(
                slice_sizes=tuple(service.slice_sizes),
                max_job_ranks=service.max_job_ranks,
                max_job_vars_mib=service.max_job_vars_mib,
                fair_share_half_life_seconds=service.fair_share_half_life_seconds,
                elastic_grow_after_seconds=service.elastic_grow_after_seconds,
            ),
        )

    # -- running -----------------------------------------------------------------------
    async def start(self) -> None:
        """Once the service listens: re-attach to running jobs, then run the queue."""
        try:
            self.preemption.restore()
            await self.reattach()
        except Exception:
            log.exception("Re-attaching to jobs")
        self._loop.start()

    async def suspend(self, grace_s: float) -> None:
        """The platform stops with its jobs (``gpulab up``'s Ctrl-C): end the loop,
        ask every running job to save a checkpoint at its next step and stop, kill
        what still runs after ``grace_s``, and queue each again: it resumes from its
        checkpoint at the next start."""
        async with self.lock:
            await self._loop.stop()
            running = [j for j in self.queue.list(states=("running",)) if self.backend_of(j)]
            if not running:
                return
            specs = {j["id"]: self.spec(j) for j in running}
            for job in running:
                self.jobdir(job).event(
                    "gpulab is stopping: SIGTERM to every rank; they save a checkpoint "
                    "at the next step, and the job resumes at gpulab's next start"
                )
                if self.backend_for(job).can_preempt:
                    await self.backend_for(job).preempt(specs[job["id"]])
            deadline = time.monotonic() + grace_s
            status, left = {}, running
            while left:  # polled once at least: every job's state is known below
                await asyncio.sleep(0.1)
                for j in left:
                    status[j["id"]] = await self.backend_for(j).poll(specs[j["id"]])
                left = [j for j in left if status[j["id"]].state == "running"]
                if time.monotonic() >= deadline:
                    break
            # Whatever missed the grace loses the steps since its last checkpoint.
            await asyncio.gather(*(self._kill_now(j, specs[j["id"]]) for j in left))
            for job in running:
                await self._settle_stopped(
                    job, specs[job["id"]], status[job["id"]], "gpulab's stop"
                )
            log.info("Stopped %d running job(s) until gpulab's next start", len(running))

    async def _kill_now(self, job: dict, spec: JobSpec) -> None:
        await self.backend_for(job).cancel(spec, grace_s=0.5)  # SIGTERM was its grace

    async def stop(self) -> None:
        """End the queue loop between passes (jobs themselves run on: a restarted
        service re-attaches to them), then close the backends' API clients."""
        try:
            await asyncio.wait_for(self.lock.acquire(), STOP_GRACE_S)
            held = True
        except TimeoutError:
            held = False  # a pass is stuck (a hung backend call): cut it short
        try:
            await self._loop.stop()
        finally:
            if held:
                self.lock.release()
        for backend in self.backends.values():  # a cluster's holds a client
            try:
                await backend.close()
            except Exception:
                log.exception("Closing the %s backend", backend.name)

    # -- reading -----------------------------------------------------------------------
    def backend_of(self, job: dict) -> Backend | None:
        """The backend of the pool a job runs in (None while an ``auto`` job waits)."""
        pool = job.get("pool")
        if not pool:  # a job of before pools: its backend's kind names the pool
            found = self.pools.of_kind(job["backend"])
            if found is None:
                return self._legacy if job["backend"] == "local" else None
            pool = found.name
        return self.backends.get(pool)

    def backend_for(self, job: dict) -> Backend:
        """The backend of a job's pool; LookupError if its pool is gone."""
        backend = self.backend_of(job)
        if backend is None:
            raise LookupError(f"job {job['id']}: no backend for pool {job.get('pool')!r}")
        return backend

    def over_host_quota(self, job: dict, ranks: int) -> str | None:
        """Why ``ranks`` ranks of ``job`` would not fit its owner's CPU and memory
        quota on this host, or None (and None off this host: Slurm and Kubernetes
        nodes have their own)."""
        if not self.backend_of(job).runs_on_this_host:
            return None
        return self.over_quota(job["user"], ranks, job["gpu_milli"], "ranks")

    def spec(self, job: dict) -> JobSpec:
        return self.jobdir(job).spec()

    def jobdir(self, job: dict) -> JobDir:
        return JobDir(self.root, job["id"])

    def view(self, job: dict, positions: dict[str, int] | None = None) -> dict:
        """The job as the API shows it (``positions``: the queue's, when the caller
        shows many jobs and so orders the queue once)."""
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
            out["position"] = (positions or self.queue.positions()).get(job["id"])
        out["has_out"] = bool(self.jobdir(job).out_path())
        if job.get("restarts"):
            # Where each restart resumed: a checkpoint's step, or None (step 0, none yet).
            told = self.jobdir(job).restart_steps()
            out["restarted_from"] = [told.get(n) for n in range(1, job["restarts"] + 1)]
        out.update(self.lineage.of(job, self.jobdir(job)))
        if not out.get("pool"):
            found = self.pools.of_kind(job["backend"])
            out["pool"] = found.name if found else job["backend"]
        slurm_job_id = getattr(self.backend_of(job), "slurm_job_id", None)
        if slurm_job_id is not None and job["state"] != "queued":
            out["slurm_job_id"] = slurm_job_id(job["id"])  # for squeue and sacct
        return out

    def lineage_of(self, job_id: str) -> dict | None:
        """``{"id", "user", "state", "code_hash", "datasets"}`` of a job, or None."""
        job = self.queue.get(job_id)
        if job is None:
            return None
        return {
            "id": job["id"],
            "user": job["user"],
            "state": job["state"],
            **self.lineage.of(job, self.jobdir(job)),
        }

    def summaries(self, user: str | None) -> list[dict]:
        """Queued and running jobs with their latest step, loss and throughput.

        For the dashboard's Jobs tab; ``user=None`` means every user's (admins).
        """
        out = []
        for job in self.queue.list(user=user, states=("queued", "running")):
            item = {k: job[k] for k in ("id", "name", "user", "state")}
            if job["state"] == "running" and self.backend_of(job) is not None:
                item.update(self._latest_progress(job))
            out.append(item)
        return out

    def _latest_progress(self, job: dict) -> dict:
        # Rank 0's report() records, read incrementally: a cursor per job.
        cursor, tail = self._tails.get(job["id"], (0, []))
        records, cursor = self.jobdir(job).metrics(0, cursor)
        tail = (tail + records)[-2:]
        self._tails[job["id"]] = (cursor, tail)
        if not tail:
            return {}
        last = tail[-1]
        progress = {k: last[k] for k in ("step", "total_steps", "loss", "lr") if k in last}
        if len(tail) == 2 and "samples" in last and last["time"] > tail[0]["time"]:
            progress["samples_per_second"] = last["samples"] / (last["time"] - tail[0]["time"])
        return progress

    # -- submitting ----------------------------------------------------------------------
    async def submit(self, who, body: dict) -> dict:
        if who.kind != "user":
            raise JobRefused(403, "jobs are submitted by users (with a user's token)")
        sent = sorted(set(body) & set(SERVICE_FIELDS))
        if sent:
            raise JobRefused(
                400,
                f"{noun(len(sent), 'field')} set by the service, not the client: {', '.join(sent)}",
            )
        try:
            spec = JobSpec.from_dict(body)
            parse_gpu_milli(spec.gpu_milli, self.limits.slice_sizes)
        except SpecTooLarge as e:
            raise JobRefused(413, str(e)) from None
        except (SpecError, SliceError, TypeError) as e:
            raise JobRefused(400, str(e)) from None
        self._check_limits(spec)
        # An elastic job waits for MIN nodes; the service sets its size at each launch.
        spec.nodes = spec.least_nodes
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
        # The backends' checks may name the job (a Kubernetes Job's name is its id).
        spec.id = uuid.uuid4().hex[:12]
        spec.user = who.name
        places = self._places_for(spec)
        total = spec.gpu_milli * spec.world_size
        groups = await self.groups_of(who.name)
        reason = never_fits(self.ledger.quotas, who.name, total, groups)
        if not reason and all(self.backends[p.name].runs_on_this_host for p in places):
            # The quota is this host's; Slurm and Kubernetes nodes have their own.
            reason = self.over_quota(who.name, spec.world_size, spec.gpu_milli, "ranks")
        if reason:
            raise JobRefused(403, reason)
        pool = places[0].name if len(places) == 1 else AUTO

        jd = JobDir(self.root, spec.id)
        os.makedirs(jd.path)
        spec.checkpoint_dir = jd.p("checkpoints")
        jd.write_inputs(spec)
        job = self.queue.add(
            {
                "id": spec.id,
                "user": who.name,
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
            }
        )
        where = (
            f"pool {pool}" if pool != AUTO else f"the first pool with room ({self.pools.names()})"
        )
        size = (
            f"{spec.min_nodes} to {spec.max_nodes} nodes of {plural(spec.nproc_per_node, 'rank')}"
            if spec.elastic
            else plural(spec.world_size, "rank")
        )
        jd.event(f"job {spec.id} queued: {size} x {label(spec.gpu_milli)}, for {where}")
        self._wake.set()
        return self.view(job)

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
                f"raise c.GpuLabService.max_job_ranks)",
            )
        limit = self.limits.max_job_vars_mib * 2**20
        if spec.vars_size > limit:
            raise JobRefused(
                413,
                f"the job's variables are {spec.vars_size / 2**20:.1f} MiB "
                f"(pickled), over the {self.limits.max_job_vars_mib} MiB a "
                f"job may carry; save large data to a file or dataset the "
                f"ranks read (an admin can raise "
                f"c.GpuLabService.max_job_vars_mib)",
            )

    def _places_for(self, spec: JobSpec) -> list[Pool]:
        """The pools the job may run in, in the site's order: those it names (or all),
        less those whose backend cannot run it or that could never place it."""
        try:
            pools = self.pools.for_job(spec.pool, spec.backend)
        except PoolRefused as e:
            raise JobRefused(400, str(e)) from None
        fits, refusals = [], []
        for pool in pools:
            try:
                self.backends[pool.name].check(spec)
                self._check_capacity(spec, pool.gpus)
            except SpecError as e:
                refusals.append((400, pool, str(e)))
                continue
            except JobRefused as e:
                refusals.append((e.status, pool, str(e)))
                continue
            fits.append(pool)
        if fits:
            return fits
        status, _, message = refusals[0]
        if len(refusals) > 1:
            message = "; ".join(f"pool {p.name}: {m}" for _, p, m in refusals)
        raise JobRefused(status, message)

    def _check_capacity(self, spec: JobSpec, gpus) -> None:
        """Refuse what this pool could never place, rather than queue it forever."""
        if not spec.gpu_milli:
            return
        if not gpus:
            raise JobRefused(409, "this cluster has no GPUs; submit with --gpu 0 (CPU ranks)")
        per_rank = max(1, spec.gpu_milli // MILLI_PER_GPU)
        per_node = {}
        for g in gpus:
            per_node[g.node] = per_node.get(g.node, 0) + 1
        if per_rank > max(per_node.values()):
            raise JobRefused(409, f"a rank asks for {per_rank} GPUs but no node has that many")
        if spec.gpu_milli * spec.world_size > MILLI_PER_GPU * len(gpus):
            raise JobRefused(
                409,
                f"the job needs {label(spec.gpu_milli * spec.world_size)} "
                f"in all but the cluster has {label(MILLI_PER_GPU * len(gpus))}; use fewer "
                f"ranks or a smaller --gpu",
            )

    # -- the loop ----------------------------------------------------------------------
    async def loop(self) -> None:
        while True:
            # Cleared before the pass: a submit during it wakes the next one at once.
            self._wake.clear()
            try:
                async with self.lock:
                    await self._poll_running()
                    await self.preemption.settle()
                    await self._admit()
                    await self.resizes.grow()
            except Exception:  # the loop must outlive one bad job or a hub hiccup
                log.exception("job loop")
            await wait_for_wake(self._wake, TICK_S)

    async def _poll_running(self) -> None:
        for job in self.queue.list(states=("running",)):
            try:
                await self._poll_one(job)
            except Exception as e:  # one broken job must not stop the others
                log.exception("Polling job %s", job["id"])
                if self.backend_of(job) is None or not os.path.exists(
                    self.jobdir(job).p("spec.json")
                ):
                    most = job.get("max_nodes") or job["nodes"]
                    owners = [f"{job['id']}/{r}" for r in range(most * job["nproc_per_node"])]
                    await self.ledger.aio.run(
                        self._finish, job, owners, "failed", f"lost its job directory: {e}", {}
                    )

    async def _poll_one(self, job: dict) -> None:
        spec = self.spec(job)
        backend = self.backend_for(job)
        status = await backend.poll(spec)
        if Resizes.elastic(job):  # its failures are the service's to count, not torchrun's
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
            self.queue.update(job["id"], restarts=status.restarts)
        if status.state == "running":
            if job["message"] == "starting":
                self.queue.update(job["id"], message="running")
            if spec.timeout and job["started"] and self._age(job) > spec.timeout:
                await backend.cancel(spec)
                await self.end(
                    job,
                    spec,
                    "failed",
                    f"timed out after {spec.timeout:g} s (--timeout)",
                    restarts=status.restarts,
                )
            return
        await self.end(
            job,
            spec,
            status.state,
            status.message or status.state,
            error=status.error,
            restarts=status.restarts,
        )

    @staticmethod
    def _age(job: dict) -> float:
        started = dt.datetime.fromisoformat(job["started"])
        return (clock.utcnow() - started).total_seconds()

    def _finish(
        self, job: dict, owners: list[str], state: str, message: str, values: dict
    ) -> int | None:
        """The job's slices go back, then its row ends (in the ledger's threads: SQLite
        may wait for another writer). In that order, a reader who sees the job ended
        finds its slices free. None if the job had already ended."""
        released = sum(len(self.ledger.release("job", o)) for o in owners)
        if not self.queue.finish(job["id"], state, message, **values):
            return None
        return released

    async def end(self, job: dict, spec: JobSpec, state: str, message: str, **values) -> None:
        """End a job: ``state`` with ``message``; its slices go back."""
        self._tails.pop(job["id"], None)
        current = self.queue.get(job["id"])
        if current is not None and current["state"] not in TERMINAL:
            # Before the row ends: a reader following the log stops once it sees the
            # end, and must find this line there.
            # The message once, not "job succeeded: succeeded".
            said = f": {message}" if message and message != state else ""
            self.jobdir(job).event(f"job {state}{said}")
        released = await self.ledger.aio.run(
            self._finish, job, spec.rank_owners(), state, message, values
        )
        if released is not None:
            if state == "succeeded":  # a nettest probe's result, read from the job itself
                self.record_probe(job, self.jobdir(job))
            if self.record_run is not None:  # in the background: MLflow may be slow
                self.record_run(self.queue.get(job["id"]) or job, self.jobdir(job), state)
            log.info(
                "Job %s of %s %s (%s); released %d slice(s)",
                job["id"],
                job["user"],
                state,
                message,
                released,
            )
            self._wake.set()

    # -- preemption ----------------------------------------------------------------------
    def _order(self, queued: list[dict]):
        """Class, then the job's priority, then its owner's decayed use, then submit time."""
        priorities = self.priorities
        use = (
            decayed(self.ledger.engine, self.limits.fair_share_half_life_seconds)
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

    async def preempt(self, job_id: str, claim) -> None:
        """Ask a running job to checkpoint and stop for ``claim`` (within the grace)."""
        job = self.queue.get(job_id)
        grace = self.preemption.grace_seconds
        self.queue.update(
            job_id,
            preempting={"claim": claim.to_json(), "deadline": claim.deadline},
            message=(
                f"preempting: saving a checkpoint at the next step to make room for "
                f"{claim.what} (grace {grace:g} s)"
            ),
        )
        spec = self.spec(job)
        self.jobdir(job).event(
            f"preempted for {claim.what}: SIGTERM to every rank; they save a checkpoint "
            f"at the next step and stop (grace {grace:g} s), then the job waits in the queue"
        )
        await self.backend_for(job).preempt(spec)

    async def _poll_preempting(self, job: dict, spec: JobSpec, status) -> None:
        """A job asked to stop: requeue it once it has (or kill it after the grace)."""
        backend = self.backend_for(job)
        claim = job["preempting"]["claim"]
        if status.state == "running":
            if time.time() > job["preempting"]["deadline"]:
                self.jobdir(job).event("the grace period ended: stopping what is left")
                await backend.cancel(spec)
                await self._requeue(job, spec, claim["what"])
            return
        await self._settle_stopped(job, spec, status, claim["what"])

    async def _settle_stopped(self, job: dict, spec: JobSpec, status, what: str) -> None:
        """A job asked to stop (for ``what``) has: ended if it finished within the
        grace period (nothing to resume), else queued again to resume."""
        if status.state == "succeeded" and self.jobdir(job).preempted_at() is None:
            await self.end(job, spec, "succeeded", "succeeded", restarts=status.restarts)
            return
        await self._requeue(job, spec, what)

    async def _requeue(self, job: dict, spec: JobSpec, what: str) -> None:
        jd = self.jobdir(job)
        latest = jd.checkpoint()
        resume = (
            f"resumes from its checkpoint at step {latest['step']}"
            if latest
            else "it had no checkpoint yet and starts over"
        )
        message = f"{PREEMPTED}{what}; waits in the queue and {resume}"

        def requeue() -> None:
            for owner in spec.rank_owners():
                self.ledger.release("job", owner)
            self.queue.update(
                job["id"],
                state="queued",
                started=None,
                preempting=None,
                resizing=None,
                preemptions=job["preemptions"] + 1,
                message=message,
                **back_to,
            )

        back_to = self._requested(job)
        if Resizes.elastic(job):  # it waits for MIN nodes again
            back_to["nodes"] = job["min_nodes"]
            spec.nodes = job["min_nodes"]
            jd.write_json("spec.json", spec.to_dict())
        jd.reset_run()
        await self.ledger.aio.run(requeue)
        self._tails.pop(job["id"], None)
        jd.event(message)
        log.info("Job %s of %s preempted (%s)", job["id"], job["user"], message)
        self._wake.set()

    async def _make_room_for(self, job: dict) -> None:
        """The head of the queue found no room: preempt for it, in the first pool it
        may run in, if its class may."""
        priorities = self.priorities
        klass = priorities.by_name.get(job["priority_class"]) or priorities.of_kind("job")
        pools = self.candidates(job)
        if not pools:
            return
        claim = await self.preemption.make_room(
            "job",
            job["user"],
            self._members(job),
            klass.value,
            f"{article(klass.name)} job",
            pools[0],
        )
        if claim is not None:
            self.queue.update(job["id"], message=claim.message())

    async def _claim_placed(self, claim, rows: list[dict]) -> None:
        job = self.queue.get(claim.members[0][0].split("/", 1)[0])
        if job is None or job["state"] != "queued":  # cancelled meanwhile
            for owner, _ in claim.members:
                await self.ledger.aio.release("job", owner)
            return
        pool = claim.pool or (self.candidates(job) or [""])[0]
        kind = self.pools.by_name[pool].kind if pool in self.pools.by_name else ""
        self.queue.start(job["id"], pool, kind)
        await self._start(self.queue.get(job["id"]), rows)

    # -- pools -------------------------------------------------------------------------
    def candidates(self, job: dict) -> list[str]:
        """The pools a queued job may start in, in order: the one it names, or for
        ``auto`` those that could run it (worked out again after a restart)."""
        pool = job.get("pool")
        if pool and pool != AUTO:
            return [pool] if pool in self.backends else []
        if not pool:  # a job of before pools
            found = self.pools.of_kind(job["backend"])
            return [found.name] if found else []
        cached = self._auto.get(job["id"])
        if cached is None:
            try:
                cached = [p.name for p in self._places_for(self.spec(job))]
            except (JobRefused, OSError, ValueError) as e:
                log.warning("Job %s fits no pool now: %s", job["id"], e)
                cached = []
            self._auto[job["id"]] = cached
        return cached

    def _places(self, job: dict) -> list[Place]:
        return [
            Place(
                name,
                self.ledger.pool(name),
                self._node_groups(job, name),
                self.pools.by_name[name].kind,
            )
            for name in self.candidates(job)
        ]

    def _requested(self, job: dict) -> dict:
        """The row's pool as submitted: a requeued ``auto`` job may start anywhere again
        (its checkpoints are in its job dir, which every pool reads)."""
        try:
            spec = self.spec(job)
        except (OSError, ValueError):
            return {}
        if len(self.pools.list) > 1 and spec.pool in ("", AUTO) and not spec.backend:
            return {"pool": AUTO, "backend": ""}
        return {}

    def _members(self, job: dict) -> list[tuple[str, int]]:
        n = job["nodes"] * job["nproc_per_node"]
        return [(f"{job['id']}/{r}", job["gpu_milli"]) for r in range(n)]

    def _node_groups(self, job: dict, pool: str) -> list[int] | None:
        """Each rank's node rank, for backends whose node ranks run on distinct nodes."""
        backend = self.backends.get(pool)
        if not getattr(backend, "nodes_apart", False) or job["nodes"] < 2:
            return None
        return [r // job["nproc_per_node"] for r in range(job["nodes"] * job["nproc_per_node"])]

    async def _admit(self) -> None:
        queued = self.queue.queued()
        if not queued:
            return
        groups = {u: await self.groups_of(u) for u in {j["user"] for j in queued}}
        admitted, blocked = await self.ledger.aio.run(
            self.queue.admit, self.ledger, groups, self._members, places=self._places
        )
        for job, rows in admitted:
            await self._start(job, rows)
        if blocked is not None and blocked["gpu_milli"]:
            await self._make_room_for(blocked)

    async def _start(self, job: dict, rows: list[dict]) -> None:
        spec = self.spec(job)
        self._auto.pop(job["id"], None)
        rows = await self.resizes.extend(job, spec, rows)
        where = sorted({f"{r['node']}:{r['gpu_index']}" for r in rows})
        pool = f" in pool {job['pool']}" if job.get("pool") and len(self.pools.list) > 1 else ""
        why = job["message"].split(": ", 1)[1] if job["message"].startswith("starting on") else ""
        on = f"{nodes_word(spec.nodes)} of {job['max_nodes']}, " if Resizes.elastic(job) else ""
        self.jobdir(job).event(
            f"job started{pool}: {on}{plural(spec.world_size, 'rank')}"
            + (f" on {noun(len(where), 'GPU')} {', '.join(where)}" if where else " on CPU")
            + (f" ({why})" if why else "")
        )
        try:
            await self.backend_for(job).start(spec, rows)
        except Exception as e:
            log.exception("Starting job %s", job["id"])
            await self.end(job, spec, "failed", f"could not start: {e}")

    # -- moving a job (self-healing) -----------------------------------------------------
    async def move(self, job_id: str, what: str, why: str) -> bool:
        """Checkpoint a running job at its next step and requeue it, e.g. off a cordoned
        GPU: the preemption path, with a claim for the job itself, so it is placed again
        (where placement allows) once it has stopped. ``what`` ends "preempted for ...";
        ``why`` is the one line its event log and message start with. Backends that
        cannot be preempted are restarted (:meth:`restart`). False if it is not running
        or already stopping."""
        async with self.lock:
            job = self.queue.get(job_id)
            backend = self.backend_of(job) if job is not None else None
            if backend is None or job["state"] != "running" or job["preempting"]:
                return False
            if not backend.can_preempt:
                await self._restart(job, what, why)
                return True
            klass = self.priorities.by_name.get(job["priority_class"])
            value = (klass or self.priorities.of_kind("job")).value
            grace = self.preemption.grace_seconds
            claim = Claim(
                "job",
                job["user"],
                self._members(job),
                value,
                what,
                [job_id],
                time.time() + grace,
                job.get("pool") or "",
            )
            self.jobdir(job).event(f"{why}; the job saves a checkpoint and moves")
            self.preemption.claims[claim.key] = claim
            await self.preempt(job_id, claim)
            self.queue.update(
                job_id,
                message=f"{why}; saving a checkpoint at the next step to move (grace {grace:g} s)",
            )
            return True

    async def restart(self, job_id: str, what: str, why: str) -> bool:
        """Stop a running job's processes now and requeue it (it resumes from its latest
        checkpoint), e.g. one that stalled. False if it is not running."""
        async with self.lock:
            job = self.queue.get(job_id)
            if job is None or job["state"] != "running" or self.backend_of(job) is None:
                return False
            await self._restart(job, what, why)
            return True

    async def _restart(self, job: dict, what: str, why: str) -> None:
        spec = self.spec(job)
        self.jobdir(job).event(f"{why}; stopping its processes to restart it")
        await self.backend_for(job).cancel(spec)
        await self._requeue(job, spec, what)

    # -- cancelling ----------------------------------------------------------------------
    async def cancel(self, job: dict, reason: str = "cancelled") -> dict:
        async with self.lock:
            job = self.queue.get(job["id"])
            if job["state"] in TERMINAL:
                return self.view(job)
            spec = self.spec(job)
            if job["state"] == "running":
                await self.backend_for(job).cancel(spec)
            await self.end(job, spec, "cancelled", reason)
        return self.view(self.queue.get(job["id"]))

    # -- restarting ----------------------------------------------------------------------
    async def reattach(self) -> None:
        """After a restart: keep watching running jobs; start admitted ones never launched."""
        for job in self.queue.list(states=("running",)):
            backend = self.backend_of(job)
            if backend is None:
                continue
            spec = self.spec(job)
            if not os.path.exists(backend.jobdir(job["id"]).p("launch.json")):
                rows = [
                    r
                    for o in spec.rank_owners()
                    for r in self.ledger.list(owner_kind="job", owner=o)
                ]
                await self._start(job, rows)
                continue
            alive = await backend.reattach(spec)
            log.info("Job %s: %s", job["id"], "re-attached" if alive else "ended while away")
