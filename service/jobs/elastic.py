"""Elastic jobs (``--nodes MIN:MAX``): grown into free slices, shrunk instead of stopped.

An elastic job starts as soon as MIN nodes fit, with as many more as fit then
(:meth:`Resizes.extend`). The job loop grows it as slices free
(:meth:`Resizes.grow`); preemption shrinks it toward MIN when other work needs
its GPUs (:meth:`Resizes.shrink`, chosen by the planner through
:mod:`gpulab.scheduler.elastic`); a failed node makes it go on without one
(:meth:`Resizes.after_failure`). Only when even MIN must go is it stopped and
queued again, as a fixed job is.

A resize is a restart at a step boundary, driven by the service, which knows
the membership (it is the scheduler): the ranks are asked to stop as for a
preemption (SIGTERM: they agree on a step, save a checkpoint there and exit),
the slices of nodes that leave go back (or those of nodes that join were placed
first), and the job is launched again at the new size, resuming from that
checkpoint. The job stays ``running`` throughout. ``benchmarks/elastic_engines.py``
measured this against torchrun's own elastic membership and TorchFT (see the
elastic how-to).

Growth is borrowing: it never takes a slice while a queued job of the same or a
higher class waits in the job's pool, or a claim waits, and the part above MIN
is the first thing taken back for such work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

from gpulab.backend.spec import JobSpec
from gpulab.db import clock
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded
from gpulab.scheduler.slices import plural
from gpulab.service.jobs.book import JobBook, elastic
from gpulab.service.jobs.places import JobPlaces
from gpulab.service.jobs.stops import JobStops
from gpulab.training.preemption import RESIZING

log = logging.getLogger("gpulab.service.jobs.elastic")


def nodes_word(n: int) -> str:
    return plural(n, "node")


class Resizes:
    """The job manager's elastic part: each resize from its start to the relaunch.
    Given the ``book`` of jobs, how a job ends (``stops``) and where jobs may run
    (``places``: growth waits for queued work that could use the pool)."""

    def __init__(
        self,
        *,
        book: JobBook,
        stops: JobStops,
        places: JobPlaces,
        priorities,
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
        grow_after_s: float,
        grace_s: float,
    ):
        self.book = book
        self.stops = stops
        self.places = places
        self.priorities = priorities
        self.groups_of = groups_of
        #: How long a job runs at a size before it may grow again (after a start, a
        #: resize or a failure): growth restarts it, so not on every freed slice.
        self.grow_after_s = grow_after_s
        #: How long the ranks get to reach a step boundary and save.
        self.grace_s = grace_s

    # -- what the scheduler reads ------------------------------------------------------
    elastic = staticmethod(elastic)

    def resizable(self, job: dict) -> bool:
        """May it be resized without losing work? Running, not being stopped or
        resized, and its steps run under ``resume_range`` (which stops at a step
        boundary with a checkpoint when asked)."""
        return (
            self.elastic(job)
            and job["state"] == "running"
            and not job.get("preempting")
            and not job.get("resizing")
            and self.book.jobdir(job).resumable()
        )

    def _owner(self, job: dict, rank: int) -> str:
        return f"{job['id']}/{rank}"

    def _node_members(self, job: dict, node: int) -> list[tuple[str, int]]:
        n = job["nproc_per_node"]
        return [(self._owner(job, r), job["gpu_milli"]) for r in range(node * n, (node + 1) * n)]

    # -- starting ------------------------------------------------------------------
    async def extend(self, job: dict, spec: JobSpec, rows: list[dict]) -> list[dict]:
        """At its start, past MIN: as many more nodes as fit now (one launch, not a
        start and an immediate growth). Returns all the job's rows."""
        if not self.elastic(job) or self._blocked(job):
            return rows
        added = await self._place_nodes(job, job["nodes"], job["max_nodes"])
        if added:
            nodes = job["nodes"] + added[0]
            rows = rows + added[1]
            spec.nodes = nodes
            self.book.jobdir(job).write_spec(spec.to_dict())
            self.book.queue.update(job["id"], nodes=nodes)
            job["nodes"] = nodes
        return rows

    async def _place_nodes(self, job: dict, have: int, most: int):
        """Place whole nodes from node ``have`` up, as many as fit (up to ``most``
        nodes in all, and within the owner's CPU and memory quota): ``(count, rows)``,
        or None when not one fits."""
        nproc = job["nproc_per_node"]
        while most > have and self.book.over_host_quota(job, most * nproc):
            most -= 1
        if not job["gpu_milli"]:
            count = most - have  # CPU ranks hold no slice
            return (count, []) if count > 0 else None
        ledger = self.book.ledger.pool(job.get("pool") or None)
        groups = await self.groups_of(job["user"])
        for count in range(most - have, 0, -1):
            nodes = range(have, have + count)
            members = [m for node in nodes for m in self._node_members(job, node)]
            try:
                rows = await ledger.aio.allocate_gang(job["user"], "job", members, groups)
            except (NoCapacity, QuotaExceeded, OwnerConflict):
                continue
            return count, rows
        return None

    # -- growing -------------------------------------------------------------------
    def _blocked(self, job: dict) -> bool:
        """Would growing take room that other work waits for? A claim, or a queued
        job of the same or a higher class in the job's pool."""
        if self.book.claims:
            return True
        priorities = self.priorities
        mine = priorities.value(job["priority_class"], "job")
        # Unordered: ordering would read every user's decayed use, in each pass.
        for other in self.book.queue.list(states=("queued",)):
            if other["id"] == job["id"] or not other["gpu_milli"]:
                continue
            if priorities.value(other["priority_class"], "job") < mine:
                continue
            pools = self.places.candidates(other)
            if not job.get("pool") or job["pool"] in pools:
                return True
        return False

    def _settled(self, job: dict) -> bool:
        """Has it trained at this size long enough to restart for more? Counted from
        when its ranks began stepping (a relaunch's start-up is not training)."""
        since = self.book.jobdir(job).stepping_since()
        return since is not None and clock.now() - since >= self.grow_after_s

    async def grow(self) -> None:
        """Grow each running elastic job below MAX into slices free now (in the loop,
        after admission: queued jobs that fit went first)."""
        for job in self.book.queue.list(states=("running",)):
            if (
                not self.resizable(job)
                or job["nodes"] >= job["max_nodes"]
                or not self._settled(job)
                or self._blocked(job)
                or not self._can_resize(self.book.backend_of(job))
            ):
                continue
            placed = await self._place_nodes(job, job["nodes"], job["max_nodes"])
            if placed is None:
                continue
            reason = "slices freed" if job["gpu_milli"] else "room freed"
            await self.begin(job, job["nodes"] + placed[0], reason)

    @staticmethod
    def _can_resize(backend) -> bool:
        """Ranks the service can stop at a step boundary, or a backend that resizes
        its jobs in place."""
        return backend is not None and (backend.can_preempt or backend.can_resize_in_place)

    # -- shrinking -----------------------------------------------------------------
    async def shrink(self, job_id: str, nodes: int, reason: str, claim_key=None) -> bool:
        """Shrink a running elastic job to ``nodes`` (>= MIN) for other work; the
        caller holds the job manager's lock. False if it cannot be resized now."""
        job = self.book.queue.get(job_id)
        if job is None or not self.resizable(job) or not job["min_nodes"] <= nodes < job["nodes"]:
            return False
        await self.begin(job, nodes, reason, claim_key)
        return True

    # -- the resize itself ---------------------------------------------------------
    async def begin(self, job: dict, nodes: int, reason: str, claim_key=None) -> None:
        """Ask the ranks to stop at their next step boundary with a checkpoint; the
        loop relaunches the job at ``nodes`` once they have (:meth:`poll`). A backend
        that resizes in place (Kubernetes: an elastic Indexed Job) is asked to."""
        verb = "growing" if nodes > job["nodes"] else "shrinking"
        deadline = time.time() + self.grace_s
        jd = self.book.jobdir(job)
        # The ranks' event says the job goes on, not that it waits in the queue.
        jd.write_json(RESIZING, {"nodes": nodes, "reason": reason})
        if await self._in_place(job, nodes, reason):
            return
        self.book.queue.update(
            job["id"],
            resizing={
                "nodes": nodes,
                "reason": reason,
                "deadline": deadline,
                "claim": list(claim_key) if claim_key else None,
            },
            message=(
                f"{verb} to {nodes_word(nodes)}: saving a checkpoint at the next step ({reason})"
            ),
        )
        jd.event(
            f"{verb} from {job['nodes']} to {nodes_word(nodes)} ({reason}): every rank "
            f"saves a checkpoint at the next step, then the job goes on at the new size"
        )
        log.info("Job %s of %s: %s to %d nodes (%s)", job["id"], job["user"], verb, nodes, reason)
        await self.book.backend_for(job).preempt(self.book.spec(job))

    async def _in_place(self, job: dict, nodes: int, reason: str) -> bool:
        """Resize through the backend itself, if it can (its torchrun agents
        re-rendezvous at the new size; the ranks checkpoint and go on): the resize
        is recorded at once. False: it cannot, the service relaunches the job."""
        backend = self.book.backend_for(job)
        if not backend.can_resize_in_place or backend.can_preempt:
            return False
        spec = self.book.spec(job)
        rows = await self._release_above(job, job["max_nodes"])
        try:
            done = await backend.resize(spec, nodes, rows)
        except Exception:
            log.exception("Resizing job %s in place", job["id"])
            done = False
        if not done:
            await self._release_above(job, job["nodes"])  # what growth placed goes back
            return False
        last = self.book.jobdir(job).last_metric(0)
        step = last.get("step", 0) if last else 0
        await self._record(job, spec, nodes, reason, step)
        return True

    async def poll(self, job: dict, spec: JobSpec, status) -> None:
        """A job being resized: relaunch it at its new size once its ranks stopped
        (or were stopped after the grace)."""
        resizing = job["resizing"]
        jd = self.book.jobdir(job)
        if status.state == "running":
            if time.time() > resizing["deadline"]:
                jd.event(
                    "the grace period ended: stopping the ranks (the steps since the "
                    "last checkpoint run again)"
                )
                await self.book.backend_for(job).cancel(spec)
                await self.relaunch(job, spec, resizing["nodes"], resizing["reason"])
            return
        if status.state == "succeeded" and jd.preempted_at() is None:
            # It finished before the step boundary came: nothing to resize.
            await self._release_above(job, job["nodes"])
            await self.stops.end(job, spec, "succeeded", "succeeded", restarts=job["restarts"])
            return
        await self.relaunch(job, spec, resizing["nodes"], resizing["reason"])

    async def after_failure(self, job: dict, spec: JobSpec, status) -> bool:
        """A node of an elastic job failed: go on without it (at MIN, in place) from
        the last checkpoint, if restarts are left (``--max-restarts`` counts failures
        here too). False when the job fails as a fixed one would."""
        if not self.elastic(job) or status.state != "failed":
            return False
        if job["restarts"] >= spec.max_restarts:
            return False
        err = status.error or {}
        where = f"rank {err['rank']} failed" if err.get("rank") is not None else "a node failed"
        what = f"{err.get('type')}: {err.get('message')}" if err.get("type") else status.message
        nodes = max(job["min_nodes"], job["nodes"] - 1)
        self.book.queue.update(job["id"], restarts=job["restarts"] + 1)
        job = self.book.queue.get(job["id"])
        await self.relaunch(job, spec, nodes, f"{where} ({_short(what)})")
        return True

    async def relaunch(self, job: dict, spec: JobSpec, nodes: int, reason: str) -> None:
        """Its ranks have stopped: the slices of nodes that leave go back, and the job
        starts again at ``nodes`` from its latest checkpoint, still ``running``."""
        jd = self.book.jobdir(job)
        step = jd.preempted_at()
        if step is None:
            latest = jd.checkpoint()
            step = latest["step"] if latest else 0
        rows = await self._release_above(job, nodes)
        await self._record(job, spec, nodes, reason, step)
        jd.reset_run()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(jd.p(RESIZING))
        try:
            await self.book.backend_for(job).start(spec, rows)
        except Exception as e:
            log.exception("Relaunching job %s", job["id"])
            await self.stops.end(job, spec, "failed", f"could not start again at {nodes}: {e}")

    async def _record(self, job: dict, spec: JobSpec, nodes: int, reason: str, step: int):
        """The job's new size, in its spec, its row (``resizes``) and its events."""
        jd = self.book.jobdir(job)
        was = job["nodes"]
        spec.nodes = nodes
        jd.write_spec(spec.to_dict())
        said = _said(was, nodes, step, reason)
        self.book.queue.update(
            job["id"],
            nodes=nodes,
            resizing=None,
            resizes=[
                *job["resizes"],
                {
                    "step": step,
                    "nodes": nodes,
                    "from_nodes": was,
                    "reason": reason,
                    "time": clock.now(),
                },
            ],
            message=f"running on {nodes_word(nodes)} ({said})",
        )
        jd.event(said)
        log.info("Job %s of %s: %s", job["id"], job["user"], said)

    async def _release_above(self, job: dict, nodes: int) -> list[dict]:
        """Give back the slices of ranks on nodes ``nodes`` and up; the rows of the rest."""
        keep = nodes * job["nproc_per_node"]
        most = job["max_nodes"] * job["nproc_per_node"]
        ledger = self.book.ledger

        def swap() -> list[dict]:
            for r in range(keep, most):
                ledger.release("job", self._owner(job, r))
            return [
                row
                for r in range(keep)
                for row in ledger.list(owner_kind="job", owner=self._owner(job, r))
            ]

        return await ledger.aio.run(swap)


def _said(was: int, nodes: int, step: int, reason: str) -> str:
    if nodes > was:
        return f"grew to {nodes_word(nodes)} at step {step}: {reason}"
    if nodes < was:
        return f"shrank to {nodes_word(nodes)} at step {step}: {reason}"
    return f"restarted on {nodes_word(nodes)} at step {step}: {reason}"


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
