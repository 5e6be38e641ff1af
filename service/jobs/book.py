"""What every part of the job manager reads and writes: the job rows, their
directories, the pools' backends, the lock and the pending claims.

The parts (:mod:`.intake`, :mod:`.admission`, :mod:`.poller`, :mod:`.stops`,
:mod:`.moves`, :mod:`.adoption`, :mod:`.elastic`, :mod:`.preemption`) are each given
this book and the parts they call, by name, when they are built; none holds the
job manager (:mod:`.manager`, the facade the routes call) or another part that
holds it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.backend.base import Backend
from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import JobSpec
from gpulab.scheduler.queue import JobQueue
from gpulab.service.jobs.backends import NoLocalJobs


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
    #: The most jobs one user may have queued (``c.JobQueue.max_queued_jobs_per_user``).
    max_queued_jobs_per_user: int = 500
    #: Elastic jobs: how long one runs at a size before it may grow again.
    elastic_grow_after_seconds: float = 10.0


def elastic(job: dict) -> bool:
    """An elastic job (``--nodes MIN:MAX``): its size moves between the two."""
    return bool(job.get("max_nodes")) and job["min_nodes"] < job["max_nodes"]


class JobBook:
    """The queue's rows (in ``order``), each job's directory under ``root``, and the
    backend of each pool (``backends``, by the pool's name)."""

    def __init__(
        self,
        *,
        ledger,
        pools,
        root: str,
        backends: dict[str, Backend],
        order: Callable[[list[dict]], Callable[[dict], tuple]],
        over_quota: Callable[[str, int, int, str], str | None],
    ):
        self.ledger = ledger
        self.queue = JobQueue(ledger.engine, order)
        self.pools = pools
        self.root = root
        self.backends = backends
        #: Why ranks of a user's job would not fit their CPU and memory quota, or None.
        self.over_quota = over_quota
        #: Jobs of an earlier local run on a site without a local pool now.
        self._legacy = NoLocalJobs(root)
        #: Held by a pass of the loop and by whatever changes the queue or stops jobs
        #: (preemption's choices too): one change at a time.
        self.lock = asyncio.Lock()
        #: Set when the queue changed: the loop's next pass starts at once.
        self.wake = asyncio.Event()
        #: Claims for slices that stopping jobs free, by (kind, first owner): kept here
        #: because preemption makes them, moves make them for a job itself, and an
        #: elastic job does not grow while one waits.
        self.claims: dict[tuple[str, str], object] = {}

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

    def jobdir(self, job: dict) -> JobDir:
        return JobDir(self.root, job["id"])

    def spec(self, job: dict) -> JobSpec:
        """The job's spec from its folder, with who and what it is taken from its row:
        where its pods can write the folder (Kubernetes), a spec naming another job's
        id, more GPU or nodes than were granted, or a class it was not given, is not
        believed, nor a checkpoint folder elsewhere."""
        spec = self.jobdir(job).spec()
        spec.id, spec.user = job["id"], job["user"]
        # Where the intake put it, whatever the folder says now.
        spec.checkpoint_dir = self.jobdir(job).p("checkpoints")
        spec.gpu_milli, spec.nproc_per_node = job["gpu_milli"], job["nproc_per_node"]
        spec.priority, spec.priority_class = job["priority"], job["priority_class"]
        spec.preemptible = bool(job["preemptible"])
        if elastic(job):
            spec.min_nodes, spec.max_nodes = job["min_nodes"], job["max_nodes"]
        else:
            spec.min_nodes = spec.max_nodes = 0
        # Its size moves with resizes (the spec is written first, then the row): never
        # past what it may grow to.
        spec.nodes = max(1, min(spec.nodes, job.get("max_nodes") or job["nodes"]))
        return spec

    def over_host_quota(self, job: dict, ranks: int) -> str | None:
        """Why ``ranks`` ranks of ``job`` would not fit its owner's CPU and memory
        quota on this host, or None (and None off this host: Slurm and Kubernetes
        nodes have their own)."""
        if not self.backend_of(job).runs_on_this_host:
            return None
        return self.over_quota(job["user"], ranks, job["gpu_milli"], "ranks")

    @staticmethod
    def members(job: dict) -> list[tuple[str, int]]:
        """The ledger's owners of a job's ranks, with each one's slice."""
        n = job["nodes"] * job["nproc_per_node"]
        return [(f"{job['id']}/{r}", job["gpu_milli"]) for r in range(n)]
