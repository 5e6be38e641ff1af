"""Where a job may run: the pools that could place it, in the site's order.

Worked out from the job's spec at submit (:meth:`JobPlaces.places_for`, which
refuses what no pool could ever place) and again for each queued ``auto`` job
(:meth:`JobPlaces.candidates`, kept until it starts).
"""

from __future__ import annotations

import logging

from gpulab.backend.spec import JobSpec, SpecError
from gpulab.scheduler.queue import Place
from gpulab.scheduler.slices import MILLI_PER_GPU, label, plural
from gpulab.service.jobs.book import JobBook, JobRefused
from gpulab.service.jobs.pools import AUTO, Pool, PoolRefused

log = logging.getLogger("gpulab.service.jobs.places")


class JobPlaces:
    """The pools each job may start in, from ``book``'s pools and backends."""

    def __init__(self, book: JobBook):
        self.book = book
        #: Queued ``auto`` jobs: the pools each may start in (from its spec, once).
        self._auto: dict[str, list[str]] = {}

    def forget(self, job_id: str) -> None:
        """The job started: its pool is chosen."""
        self._auto.pop(job_id, None)

    def candidates(self, job: dict) -> list[str]:
        """The pools a queued job may start in, in order: the one it names, or for
        ``auto`` those that could run it (worked out again after a restart)."""
        pool = job.get("pool")
        if pool and pool != AUTO:
            return [pool] if pool in self.book.backends else []
        if not pool:  # a job of before pools
            found = self.book.pools.of_kind(job["backend"])
            return [found.name] if found else []
        cached = self._auto.get(job["id"])
        if cached is None:
            try:
                cached = [p.name for p in self.places_for(self.book.spec(job))]
            except (JobRefused, OSError, ValueError) as e:
                log.warning("Job %s fits no pool now: %s", job["id"], e)
                cached = []
            self._auto[job["id"]] = cached
        return cached

    def places(self, job: dict) -> list[Place]:
        """The queue's view of each pool the job may start in (for admission)."""
        pools = self.book.pools.by_name
        return [
            Place(name, self.book.ledger.pool(name), self._node_groups(job, name), pools[name].kind)
            for name in self.candidates(job)
        ]

    def requested(self, job: dict) -> dict:
        """The row's pool as submitted: a requeued ``auto`` job may start anywhere again
        (its checkpoints are in its job dir, which every pool reads)."""
        try:
            spec = self.book.spec(job)
        except (OSError, ValueError):
            return {}
        if len(self.book.pools.list) > 1 and spec.pool in ("", AUTO) and not spec.backend:
            return {"pool": AUTO, "backend": ""}
        return {}

    def _check_placeable(self, spec: JobSpec, pool: Pool) -> None:
        """Refuse a gang the pool could not place even empty (a 2-GPU rank per node on
        3-GPU nodes, 3/4-GPU ranks that leave a quarter of each GPU): queued, it would
        find no room at the head of the queue for ever, and hold up every job behind."""
        if not spec.gpu_milli:
            return
        job = {"nodes": spec.nodes, "nproc_per_node": spec.nproc_per_node}
        groups = self._node_groups(job, pool.name)
        members = [(str(r), spec.gpu_milli) for r in range(spec.world_size)]
        if self.book.ledger.pool(pool.name).could_place_when_empty(members, groups):
            return
        # What each node holds when empty: a rank's share is on one GPU, its GPUs on one node.
        per_node: dict[str, int] = {}
        for g in pool.gpus:
            per_node[g.node] = per_node.get(g.node, 0) + 1
        if spec.gpu_milli < MILLI_PER_GPU:
            holds = [n * (MILLI_PER_GPU // spec.gpu_milli) for n in per_node.values()]
        else:
            holds = [n // (spec.gpu_milli // MILLI_PER_GPU) for n in per_node.values()]
        size = label(spec.gpu_milli)
        if groups is None:
            raise JobRefused(
                409,
                f"the job has {spec.world_size} ranks of {size} but this cluster holds at "
                f"most {sum(holds)} of that size even when every GPU is free; use at most "
                f"{sum(holds)} ranks, or a --gpu that divides a GPU (or a node's GPUs) evenly",
            )
        enough = sum(1 for h in holds if h >= spec.nproc_per_node)
        if not enough:
            fact = f"no machine here holds more than {max(holds)}"
        elif enough < spec.nodes:
            fact = f"only {plural(enough, 'machine')} here can"
        else:  # machines enough, but not as this site's placement policy fills them
            fact = "this cluster's placement cannot put them so"
        raise JobRefused(
            409,
            f"each of the job's {plural(spec.nodes, 'node')} needs {spec.nproc_per_node} "
            f"ranks of {size} on a machine of its own, and {fact} even when every GPU is "
            f"free; use fewer --nodes or --nproc-per-node, or a smaller --gpu",
        )

    def _node_groups(self, job: dict, pool: str) -> list[int] | None:
        """Each rank's node rank, for backends whose node ranks run on distinct nodes."""
        backend = self.book.backends.get(pool)
        if not getattr(backend, "nodes_apart", False) or job["nodes"] < 2:
            return None
        return [r // job["nproc_per_node"] for r in range(job["nodes"] * job["nproc_per_node"])]

    def places_for(self, spec: JobSpec) -> list[Pool]:
        """The pools the job may run in, in the site's order: those it names (or all),
        less those whose backend cannot run it or that could never place it."""
        try:
            pools = self.book.pools.for_job(spec.pool, spec.backend)
        except PoolRefused as e:
            raise JobRefused(400, str(e)) from None
        fits, refusals = [], []
        for pool in pools:
            try:
                self.book.backends[pool.name].check(spec)
                _check_capacity(spec, pool.gpus)
                self._check_placeable(spec, pool)
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


def _check_capacity(spec: JobSpec, gpus) -> None:
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
