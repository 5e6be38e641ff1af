"""Replay the Alibaba GPU trace *in time* with priority classes and preemption.

    python benchmarks/priority_replay.py [--traces DIR] [--loads 1.0,1.3,1.5]
        [--policies fifo,priority,kueue-classic,gpulab,gpulab-elastic]
        [--checkpoint-interval 1800] [--grace 30] [--resize-pause 10] [--hours 1]
        [--placement gpulab] [--limit N] [--jobs 1]

A discrete-event simulation (one heap of events) of the trace's GPU pods on its
1,213 GPU nodes. The protocol:

Workload
    Only GPU pods (``num_gpu > 0``). Each needs ``deletion_time -
    creation_time`` seconds of *running* (its work); a preempted pod keeps what
    its last checkpoint saved and needs the rest. qos ``LS`` and ``Guaranteed``
    are the high class (value 1000, never preempted: interactive and serving
    are one class here, the metrics do not tell them apart); ``BE`` and
    ``Burstable`` are batch (value 100, preemptible).

Load factor
    Replayed as it is, the trace barely loads its cluster: its pods never
    hold more than 66 of the 6,212 GPUs at once, and all of them together ask
    for 6,087 GPUs, less than the cluster. So ``creation_time / L`` alone
    would give no contention at any L. We keep the trace's arrival *pattern*
    and its durations, and speed its arrivals up and repeat it back to back
    (copy k of a pod arrives at ``(k + a / span) * W``, ``a`` its creation time
    after the trace's dense window starts, ``span`` that window) over a horizon
    of ``--hours``; the cycle length ``W`` is found by bisection so that the
    *offered load* -- the mean GPU demand over the horizon if every pod started
    on arrival, over the GPU capacity -- equals L. Pods running longer than the
    horizon (a few run for months) simply stay.

Queue and placement
    Waiting pods are tried in order -- ``fifo``: arrival order, no classes;
    the others: class, then arrival -- and each is placed with the registered
    placement policy (``--placement``) through ``Cluster``/``cluster.apply``.
    Every policy backfills: a pod that fits goes even when one before it does
    not, so ``fifo`` is not pathologically worse. Pods of one shape (the same
    ``Request``) fit or not alike, so a shape that did not fit is skipped
    until one of the nodes it could use frees room.

Preemption (only ``kueue-classic``, ``gpulab`` and ``gpulab-elastic``)
    A high pod that does not fit asks for room held by running batch pods.
    ``kueue-classic`` (Kueue's LowerPriority, newest first): candidates newest
    start first, added until the pod fits, then unneeded ones dropped in
    reverse order; victims get SIGTERM, run out the grace period and are
    killed, losing all work since their last periodic checkpoint (they do not
    checkpoint on SIGTERM). ``gpulab``: ``scheduler.preemption.choose_victims``
    with ``at_risk`` = GPU fraction x seconds since the last checkpoint;
    victims finish the training step in flight (``--step``, 10 s; the step
    boundary is at a multiple of the step since the run started), write a
    checkpoint (``--save``, 5 s) and exit: after ``min(grace, to-boundary +
    save)``; one that cannot finish within the grace is killed as above.
    Either way the high pod waits until its victims exit, and each victim goes
    back to the queue with its remaining work and its original arrival time.
    Periodic checkpoints (``--checkpoint-interval`` of running, counted from
    each start) cost nothing here; a run restarts from its last checkpoint.
    Both look only at holders on the ``PREEMPT_NODES`` (16) nodes where the
    pod could fit once their batch pods left, those holding the least batch
    GPU first.

Elastic jobs (only ``gpulab-elastic``; elsewhere every pod is fixed)
    Which pods: the batch pods asking for two or more whole GPUs -- 23 of the
    trace's 3,047 batch GPU pods (21 of 8 GPUs, one of 4, one of 2), but 72% of
    its batch GPU-seconds. A pod of several whole GPUs is a data-parallel job
    whose GPUs are its workers (the "nodes" of ``--nodes MIN:MAX``); a pod of
    one GPU or a fraction of one has nothing to shed, so it stays fixed, as do
    all high pods (never preempted, nothing to make room for). MIN is one
    worker, MAX the GPUs the pod asked for; each worker brings its GPU and its
    share of the pod's CPU and memory, and all stay on one node, as the trace's
    pods do. The work is GPU-seconds and kept: at w of n workers a job makes
    progress at w/n of its full speed.
    Start: a waiting elastic job waits as its MIN shape and starts at the most
    workers that fit then, down to MIN (that is where batch goodput comes from:
    it runs instead of waiting for a whole 8-GPU node).
    Shrink: a high pod that needs room first calls ``choose_victims`` with
    only the running elastic jobs' surplus (``scheduler.elastic.
    surplus_holders``: one holder per worker above MIN, at_risk = the pause x
    the GPUs it gives up); only if that finds no plan, it falls back to the
    surplus plus one holder per running batch pod as ``gpulab`` (an elastic
    job's holder covers its MIN workers only, so no slice is offered twice;
    choosing it stops the whole job). ``shrink_targets`` reads the plan's
    surplus victims back as the size each job shrinks to. A shrinking job's
    ranks stop at the step boundary with a checkpoint (as a ``gpulab`` victim:
    the step in flight and the save are counted lost on all its GPUs); its
    workers above the new size leave then (the high pod waits for that, no
    longer than for a victim), and the rest restart smaller after
    ``--resize-pause`` (10 s), counted lost on the GPUs that stay. Nothing goes
    back to the queue. A job in the middle of a resize is nobody's victim.
    Grow: after each event pass, a running elastic job below MAX takes the free
    GPUs of its node (and their CPU and memory), but only while no high pod
    waits (room a high pod could use is its; waiting batch pods were just
    tried and fit nowhere) and only if it then finishes sooner by more than the
    pause it costs (step boundary + save + restart, lost on every GPU it then
    holds).

Metrics, over the horizon (the simulation stops there)
    high wait p50/p99 (s): first start - arrival; a high pod still waiting at
    the end counts with its wait so far. batch completion (h): finish -
    arrival of the batch pods finished within the horizon (mean, p50).
    batch goodput (GPU-h): work of the batch pods finished within the horizon.
    lost (GPU-h): per victim, GPU fraction x (work redone -- since the saved
    checkpoint -- plus the time from SIGTERM to exit); for a ``gpulab`` victim
    that checkpoints that is the step in flight plus the save (the step's work
    is conservatively counted lost); for a resize, the pause x the GPUs held
    through it (see Elastic jobs). preemptions: victims that exited. shrink,
    grow: resizes of elastic jobs.
    allocation rate: GPU milli held (victims in their grace included) over
    time, / capacity x horizon.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from gpulab.scheduler.elastic import shrink_targets, surplus_holders
from gpulab.scheduler.policy import Cluster, Placement, PlacementPolicy, Request, get_policy
from gpulab.scheduler.preemption import Holder, choose_victims
from gpulab.scheduler.trace import NodeSpec, load_nodes

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"

HIGH_CLASS, BATCH_CLASS = 1000, 100
HIGH_QOS = {"LS", "Guaranteed"}
SCHEMES = ("fifo", "priority", "kueue-classic", "gpulab", "gpulab-elastic")
PREEMPTING = {"kueue-classic", "gpulab", "gpulab-elastic"}
#: Schemes whose victims stop at a step boundary with a checkpoint (choose_victims).
CHECKPOINTING = {"gpulab", "gpulab-elastic"}
#: Schemes that run the trace's multi-GPU batch pods as elastic jobs.
ELASTIC = {"gpulab-elastic"}
#: An elastic pod's MIN: one worker (GPU). Its MAX is the GPUs the trace pod asked for.
ELASTIC_MIN = 1
LOADS = (1.0, 1.3, 1.5)
#: Nodes a preemption looks at: those where the pod could fit once their batch
#: pods left, the ones holding the least batch GPU first (both policies alike;
#: it keeps one preemption from walking thousands of holders).
PREEMPT_NODES = 16


# --- the trace --------------------------------------------------------------------


@dataclass(frozen=True)
class TracePod:
    """One GPU pod of the trace: what it asks, its class, when it came, how long it ran."""

    request: Request
    high: bool
    creation: float
    duration: float


@dataclass(frozen=True)
class Arrival:
    """One pod of the replay: the trace pod at its (sped-up) arrival time."""

    time: float
    request: Request
    high: bool
    work: float  # seconds of running it needs


def is_elastic(request: Request, high: bool) -> bool:
    """A batch pod asking for two or more whole GPUs: a data-parallel job whose GPUs
    are its workers, so it can run on fewer (see the docstring's Elastic jobs)."""
    return not high and request.num_gpu >= 2 and request.gpu_milli == 1000


def width_request(full: Request, width: int) -> Request:
    """``full`` with ``width`` of its workers: each worker brings one GPU and its share
    of the CPU and memory."""
    if width == full.num_gpu:
        return full
    return Request(
        gpu_milli=full.gpu_milli,
        num_gpu=width,
        cpu_milli=-(-full.cpu_milli * width // full.num_gpu),
        memory_mib=-(-full.memory_mib * width // full.num_gpu),
        gpu_models=full.gpu_models,
    )


def load_pods(path: str | Path) -> list[TracePod]:
    """The GPU pods of an ``openb_pod_list_*.csv``, in creation order."""
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            num = int(row["num_gpu"])
            if not num:
                continue
            spec = (row.get("gpu_spec") or "").strip()
            models = frozenset(m for m in spec.split("|") if m) or None
            request = Request(
                gpu_milli=int(row["gpu_milli"]),
                num_gpu=num,
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                gpu_models=models,
            )
            created = float(row["creation_time"])
            pods.append(
                TracePod(
                    request,
                    row["qos"] in HIGH_QOS,
                    created,
                    max(float(row["deletion_time"]) - created, 0.0),
                )
            )
    return sorted(pods, key=lambda p: p.creation)


def _pattern(pods: Sequence[TracePod], start_quantile: float = 0.005) -> np.ndarray:
    """Each pod's place in the trace's arrival window, 0..1.

    A few pods were created months before the rest (the trace is a snapshot);
    they count as arriving when the dense window starts."""
    created = np.array([p.creation for p in pods])
    start = np.quantile(created, start_quantile)
    offset = np.maximum(created - start, 0.0)
    return offset / max(offset.max(), 1.0)


def _cycled(pattern: np.ndarray, cycle: float, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times and trace indices of the trace repeated every ``cycle`` s."""
    copies = math.ceil(horizon / cycle)
    times = (np.arange(copies)[:, None] + pattern[None, :]).ravel() * cycle
    index = np.tile(np.arange(len(pattern)), copies)
    keep = times < horizon
    order = np.argsort(times[keep], kind="stable")
    return times[keep][order], index[keep][order]


def offered_load(
    pods: Sequence[TracePod], pattern: np.ndarray, cycle: float, horizon: float, capacity: float
) -> float:
    """Mean GPU demand over the horizon if every pod started on arrival, / capacity."""
    times, index = _cycled(pattern, cycle, horizon)
    gpus = np.array([p.request.total_gpu_milli / 1000 for p in pods])[index]
    durations = np.array([p.duration for p in pods])[index]
    return float((gpus * np.minimum(durations, horizon - times)).sum() / (capacity * horizon))


def build_stream(
    pods: Sequence[TracePod], load: float, capacity_gpus: float, horizon: float
) -> tuple[list[Arrival], float]:
    """The arrivals at ``load`` and the cycle length found for it (see the docstring)."""
    pattern = _pattern(pods)
    lo, hi = horizon / 10_000, horizon * 100  # short cycle = much load, long = little
    for _ in range(60):  # bisection on a log scale; offered load falls as the cycle grows
        mid = math.sqrt(lo * hi)
        if offered_load(pods, pattern, mid, horizon, capacity_gpus) > load:
            lo = mid
        else:
            hi = mid
    cycle = math.sqrt(lo * hi)
    times, index = _cycled(pattern, cycle, horizon)
    stream = [
        Arrival(float(t), pods[i].request, pods[i].high, pods[i].duration)
        for t, i in zip(times, index, strict=True)
    ]
    return stream, cycle


# --- the simulation ---------------------------------------------------------------


@dataclass
class Config:
    checkpoint_interval: float = 1800.0
    grace: float = 30.0
    step: float = 10.0  # gpulab victims stop at the next step boundary ...
    save: float = 5.0  # ... and write a checkpoint this long
    placement: str = "gpulab"
    resize_pause: float = 10.0  # an elastic job's restart at its new size


@dataclass
class Pod:
    id: int
    arrival: float
    request: Request
    high: bool
    work: float
    shape: int
    remaining: float = 0.0  # seconds of running at its full size
    elastic: bool = False  # runs at 1..num_gpu workers (gpulab-elastic only)
    full: Request | None = None  # what it asked; ``request`` is its size now
    # while running
    node: int = -1
    gpus: tuple[int, ...] = ()
    started: float = -1.0  # start of the current run
    token: int = 0  # bumps on every start, so a stale finish event is ignored
    terminating: bool = False
    # bookkeeping
    first_start: float = -1.0
    finished: float = -1.0
    preemptor: int = -1  # the high pod this victim makes room for
    pending: set[int] = field(default_factory=set)  # a high pod's victims not yet gone
    # a shrink under way: the GPU slots, CPU and memory it gives back at the boundary
    giving_back: tuple[tuple[int, ...], int, int] = ((), 0, 0)

    def __post_init__(self) -> None:
        if self.full is None:
            self.full = self.request

    @property
    def gpu(self) -> float:
        """GPUs held now."""
        return self.request.total_gpu_milli / 1000

    @property
    def gpu_work(self) -> float:
        """Its work in GPU-seconds: the same at any size."""
        return self.full.total_gpu_milli / 1000 * self.work

    @property
    def rate(self) -> float:
        """Progress per second of running, in seconds at its full size: an elastic
        job at half its workers takes twice as long."""
        return self.request.num_gpu / self.full.num_gpu

    def done_at_start(self) -> float:
        return self.work - self.remaining

    def progress(self, now: float) -> float:
        """Work done by ``now`` (in seconds at full size); none during a resize pause,
        when ``started`` (the run's restart) is still ahead."""
        return self.done_at_start() + max(now - self.started, 0.0) * self.rate

    def finish_time(self) -> float:
        return self.started + self.remaining / self.rate

    def last_checkpoint(self, now: float, interval: float) -> float:
        """When the current run last checkpointed (its start counts: it restored one)."""
        if now <= self.started:
            return self.started
        return self.started + math.floor((now - self.started) / interval) * interval


@dataclass
class Result:
    scheme: str
    load: float
    pods: int
    high_wait_p50: float
    high_wait_p99: float
    batch_completion_mean_h: float
    batch_completion_p50_h: float
    batch_goodput_gpu_h: float
    lost_gpu_h: float
    preemptions: int
    allocation_rate: float
    batch_finished: int
    batch_total: int
    shrinks: int = 0  # elastic jobs shrunk instead of stopped
    grows: int = 0  # elastic jobs grown into free room
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


ARRIVE, FINISH, EXIT, SHRUNK, RESUMED = 0, 1, 2, 3, 4


class Replay:
    """One (load, scheme) run. ``run()`` returns a :class:`Result`."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        stream: Sequence[Arrival],
        scheme: str,
        config: Config,
        horizon: float,
        load: float = 0.0,
        workload: Iterable[Request] | None = None,
    ):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
        self.scheme, self.config, self.horizon, self.load = scheme, config, horizon, load
        self.cluster = Cluster.build(nodes)
        self.placer: PlacementPolicy = get_policy(
            config.placement, workload=list(workload or (a.request for a in stream)), seed=0
        )
        self.capacity = int(self.cluster.gpu_exists.sum()) * 1000
        elastic = [scheme in ELASTIC and is_elastic(a.request, a.high) for a in stream]
        # An elastic pod waits as its MIN: it starts once that fits.
        queued = [
            width_request(a.request, ELASTIC_MIN) if e else a.request
            for a, e in zip(stream, elastic, strict=True)
        ]
        self._init_shapes(queued)
        self.pods = [
            Pod(i, a.time, a.request, a.high, a.work, self.shape_of[q], a.work, e)
            for i, (a, q, e) in enumerate(zip(stream, queued, elastic, strict=True))
        ]
        n, g = self.cluster.gpu_free.shape
        # What running batch pods (not yet told to stop) hold: free + this is the
        # room a high pod could get by preemption.
        self.batch_gpu = np.zeros((n, g), dtype=np.int64)
        self.batch_cpu = np.zeros(n, dtype=np.int64)
        self.batch_mem = np.zeros(n, dtype=np.int64)
        self.batch_on_node: dict[int, set[int]] = defaultdict(set)
        self.queue: list[list[tuple]] = [[] for _ in self.shape_req]  # per shape, a heap
        self.blocked = np.zeros(len(self.shape_req), dtype=bool)
        self.high_waiting = np.zeros(len(self.shape_req), dtype=np.int64)
        self.dirty: set[int] = set()  # nodes with more free room since the last pass
        self.room_dirty: set[int] = set()  # nodes with more preemptible room
        self.try_shapes: set[int] = set()
        self.grow_nodes: set[int] = set()  # nodes with free room an elastic job may grow into
        self.retry_shapes: set[int] = set()
        self.events: list[tuple] = []
        self.seq = 0
        self.now = 0.0
        self.allocated = 0  # milli held now
        self.alloc_area = 0.0  # milli x seconds
        self.lost_gpu_s = 0.0
        self.preemptions = 0
        self.shrinks = 0
        self.grows = 0

    # shapes: pods with one Request fit or not alike ---------------------------------

    def _init_shapes(self, requests: Sequence[Request]) -> None:
        self.shape_req = list(dict.fromkeys(requests))
        self.shape_of = {r: i for i, r in enumerate(self.shape_req)}
        c = self.cluster
        self.sh_milli = np.array([r.gpu_milli for r in self.shape_req], dtype=np.int64)
        self.sh_num = np.array([r.num_gpu for r in self.shape_req], dtype=np.int64)
        self.sh_cpu = np.array([r.cpu_milli for r in self.shape_req], dtype=np.int64)
        self.sh_mem = np.array([r.memory_mib for r in self.shape_req], dtype=np.int64)
        # allowed[s, model + 1]: column 0 is NO_GPU (a padded slot), never allowed
        allowed = np.zeros((len(self.shape_req), len(c.models) + 1), dtype=bool)
        for s, r in enumerate(self.shape_req):
            for m, name in enumerate(c.models):
                allowed[s, m + 1] = r.gpu_models is None or name in r.gpu_models
        self.sh_allowed = allowed
        self.sh_slot_ok = [allowed[s][c.gpu_model + 1] for s in range(len(self.shape_req))]

    def _shapes_fitting_node(self, node: int, gpu: np.ndarray, cpu: int, mem: int) -> np.ndarray:
        """(S,) bool: shapes that fit on ``node`` given its free (or room) vectors."""
        slot_ok = self.sh_allowed[:, self.cluster.gpu_model[node] + 1]  # (S, G)
        fit_slots = ((gpu[None, :] >= self.sh_milli[:, None]) & slot_ok).sum(axis=1)
        return (fit_slots >= self.sh_num) & (self.sh_cpu <= cpu) & (self.sh_mem <= mem)

    def _nodes_fitting(self, shape: int, gpu: np.ndarray, cpu: np.ndarray, mem: np.ndarray):
        """(N,) bool: nodes where ``shape`` fits given free (or room) arrays."""
        fit_slots = ((gpu >= self.sh_milli[shape]) & self.sh_slot_ok[shape]).sum(axis=1)
        return (
            (fit_slots >= self.sh_num[shape])
            & (cpu >= self.sh_cpu[shape])
            & (mem >= self.sh_mem[shape])
        )

    # events -------------------------------------------------------------------------

    def _push(self, t: float, kind: int, pod: int, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, pod, token))

    def _advance(self, t: float) -> None:
        self.alloc_area += self.allocated * (t - self.now)
        self.now = t

    def _order(self, pod: Pod) -> tuple:
        if self.scheme == "fifo":
            return (pod.arrival, pod.id)
        return (0 if pod.high else 1, pod.arrival, pod.id)

    def _enqueue(self, pod: Pod) -> None:
        heapq.heappush(self.queue[pod.shape], (self._order(pod), pod.id))
        if pod.high:
            self.high_waiting[pod.shape] += 1

    def run(self) -> Result:
        started = time.perf_counter()
        for pod in self.pods:
            self._push(pod.arrival, ARRIVE, pod.id)
        while self.events and self.events[0][0] <= self.horizon:
            t, _, kind, pid, token = heapq.heappop(self.events)
            self._advance(t)
            pod = self.pods[pid]
            if kind == ARRIVE:
                self._arrive(pod)
            elif kind == FINISH and token == pod.token and pod.node >= 0:
                self._finish(pod)
            elif kind == EXIT and token == pod.token and pod.node >= 0:
                self._exit(pod)
            elif kind == SHRUNK and token == pod.token and pod.node >= 0:
                self._shrunk(pod)
            elif kind == RESUMED and token == pod.token and pod.node >= 0:
                self._resumed(pod)
            self._schedule()
            if self.scheme in PREEMPTING:
                self._preempt_for_waiting()
            if self.scheme in ELASTIC:
                self._grow_into_free_room()
        self._advance(self.horizon)
        result = self._result()
        result.wall_s = time.perf_counter() - started
        return result

    def _arrive(self, pod: Pod) -> None:
        s = pod.shape
        if not self.queue[s] and self._try_start(pod):
            return
        self._enqueue(pod)
        self.blocked[s] = True
        if pod.high:
            self.retry_shapes.add(s)

    def _finish(self, pod: Pod) -> None:
        if pod.terminating:  # done within its grace: its preemptor stops waiting for it
            self._release_preemptor(pod)
        pod.remaining = 0.0
        pod.finished = self.now
        self._release(pod)
        pod.terminating = False

    def _exit(self, pod: Pod) -> None:
        self.preemptions += 1
        self._release_preemptor(pod)
        self._release(pod)
        pod.terminating = False
        self._enqueue(pod)
        self.try_shapes.add(pod.shape)

    def _release_preemptor(self, victim: Pod) -> None:
        high = self.pods[victim.preemptor]
        high.pending.discard(victim.id)
        if not high.pending and high.first_start < 0:
            self.retry_shapes.add(high.shape)  # room freed went elsewhere: ask again

    # starting and stopping ------------------------------------------------------------

    def _try_start(self, pod: Pod) -> bool:
        fitting = self._fitting_size(pod)
        if fitting is None:
            return False
        pod.request, placement = fitting
        self.cluster.apply(placement, pod.request)
        pod.node, pod.gpus, pod.started = placement.node, placement.gpus, self.now
        pod.token += 1
        if pod.first_start < 0:
            pod.first_start = self.now
        self.allocated += pod.request.total_gpu_milli
        if not pod.high:
            self._count_batch(pod, +1)
        self._push(pod.finish_time(), FINISH, pod.id, pod.token)
        return True

    def _fitting_size(self, pod: Pod) -> tuple[Request, Placement] | None:
        """The request to start ``pod`` with and where it goes, or None if it fits
        nowhere: a fixed pod as it asked; an elastic one at the most workers that
        fit now, down to MIN (it grows when room frees)."""
        if not pod.elastic:
            placement = self.placer.place(self.cluster, pod.request)
            return None if placement is None else (pod.request, placement)
        for width in range(pod.full.num_gpu, ELASTIC_MIN - 1, -1):
            request = width_request(pod.full, width)
            if not self.cluster.feasible_nodes(request).any():
                continue  # cheap test first: the placer scores every node
            placement = self.placer.place(self.cluster, request)
            if placement is not None:
                return request, placement
        return None

    def _count_batch(self, pod: Pod, sign: int) -> None:
        r, n = pod.request, pod.node
        for g in pod.gpus:
            self.batch_gpu[n, g] += sign * r.gpu_milli
        self.batch_cpu[n] += sign * r.cpu_milli
        self.batch_mem[n] += sign * r.memory_mib
        if sign > 0:
            self.batch_on_node[n].add(pod.id)
        else:
            self.batch_on_node[n].discard(pod.id)

    def _release(self, pod: Pod) -> None:
        c, r, n = self.cluster, pod.request, pod.node
        for g in pod.gpus:
            c.gpu_free[n, g] += r.gpu_milli
        c.cpu_free[n] += r.cpu_milli
        c.mem_free[n] += r.memory_mib
        self.allocated -= r.total_gpu_milli
        if not pod.high and not pod.terminating:
            self._count_batch(pod, -1)
        elif pod.high:
            self.room_dirty.add(n)  # a high pod left: more room to preempt into
        self.dirty.add(n)
        self.grow_nodes.add(n)
        pod.node, pod.gpus = -1, ()

    # the queue pass -------------------------------------------------------------------

    def _schedule(self) -> None:
        """Start waiting pods, in order, that fit in the room freed since the last pass."""
        c = self.cluster
        candidates = set(self.try_shapes)
        self.try_shapes.clear()
        for n in self.dirty:
            fits = self._shapes_fitting_node(
                n, c.gpu_free[n], int(c.cpu_free[n]), int(c.mem_free[n])
            )
            candidates.update(np.flatnonzero(fits & self.blocked).tolist())
        self.dirty.clear()
        heads = [(self.queue[s][0][0], s) for s in candidates if self.queue[s]]
        heapq.heapify(heads)
        while heads:
            _, s = heapq.heappop(heads)
            pod = self.pods[self.queue[s][0][1]]
            if not self._try_start(pod):
                self.blocked[s] = True
                continue
            heapq.heappop(self.queue[s])
            if pod.high:
                self.high_waiting[s] -= 1
            if self.queue[s]:
                heapq.heappush(heads, (self.queue[s][0][0], s))
            else:
                self.blocked[s] = False

    # preemption -----------------------------------------------------------------------

    def _preempt_for_waiting(self) -> None:
        """Ask for room for waiting high pods whose chances changed since they last asked."""
        c = self.cluster
        for n in self.room_dirty:
            fits = self._shapes_fitting_node(
                n,
                c.gpu_free[n] + self.batch_gpu[n],
                int(c.cpu_free[n] + self.batch_cpu[n]),
                int(c.mem_free[n] + self.batch_mem[n]),
            )
            self.retry_shapes.update(
                np.flatnonzero(fits & self.blocked & (self.high_waiting > 0)).tolist()
            )
        self.room_dirty.clear()
        shapes, self.retry_shapes = self.retry_shapes, set()
        for s in shapes:
            if self.high_waiting[s] == 0:
                continue
            # In queue order, each high pod with no victims on their way out asks
            # until one finds no room: those after it would find none either.
            for _, pid in sorted(self.queue[s]):
                pod = self.pods[pid]
                if pod.high and not pod.pending and not self._preempt_for(pod):
                    break

    def _preempt_for(self, pod: Pod) -> bool:
        """Tell the victims that make room for ``pod`` to stop; False if none would."""
        c, shape = self.cluster, pod.shape
        nodes = np.flatnonzero(
            self._nodes_fitting(
                shape,
                c.gpu_free + self.batch_gpu,
                c.cpu_free + self.batch_cpu,
                c.mem_free + self.batch_mem,
            )
        )
        if not len(nodes):
            return False
        if len(nodes) > PREEMPT_NODES:
            held = self.batch_gpu[nodes].sum(axis=1)
            nodes = nodes[np.argsort(held, kind="stable")[:PREEMPT_NODES]]
        # Only holders on nodes where the pod could fit can make room for it; an
        # elastic job in the middle of a resize is not one (it asks again once the
        # job runs: see _resumed).
        running = [self.pods[v] for n in nodes for v in self.batch_on_node[n]]
        running = [p for p in running if p.started <= self.now]
        if self.scheme == "gpulab-elastic":
            return self._shrink_or_stop(pod, running)
        holders = [self._holder(p) for p in running]
        if self.scheme == "gpulab":
            plan = choose_victims(c, [pod.request], holders, self.placer)
            victims = list(plan.victims) if plan else []
        else:
            victims = self._kueue_classic(shape, holders)
        if not victims:
            return False
        for h in victims:
            self._terminate(self.pods[int(h.key)], pod)
        return True

    def _shrink_or_stop(self, pod: Pod, running: list[Pod]) -> bool:
        """gpulab-elastic: make room for ``pod`` by shrinking elastic jobs if that is
        enough (nothing is lost but a pause), else as gpulab does, with the elastic
        jobs' surplus still taken before a job is stopped."""
        c = self.cluster
        surplus = [h for p in running if p.elastic for h in self._surplus(p)]
        plan = choose_victims(c, [pod.request], surplus, self.placer) if surplus else None
        if plan is None:
            whole = [self._holder(p, base_only=p.elastic) for p in running]
            plan = choose_victims(c, [pod.request], surplus + whole, self.placer)
        if plan is None:
            return False
        keys = [h.key for h in plan.victims]
        stopped = {int(k) for k in keys if k.isdigit()}
        for pid in sorted(stopped):
            self._terminate(self.pods[pid], pod)
        for job, width in sorted(shrink_targets(keys).items()):
            if int(job) not in stopped:  # a stopped job gives back its surplus anyway
                self._shrink(self.pods[int(job)], width, pod)
        return True

    def _holder(self, pod: Pod, base_only: bool = False) -> Holder:
        """The pod as one victim: stopping it loses its work since its last checkpoint.

        ``base_only``: an elastic job's holder covers its MIN workers only, so that
        it and the job's surplus holders never count a slice twice; choosing it
        stops the whole job (which frees the surplus too)."""
        since = self.now - pod.last_checkpoint(self.now, self.config.checkpoint_interval)
        gpus = pod.gpus[:ELASTIC_MIN] if base_only else pod.gpus
        return Holder(
            key=str(pod.id),
            user="",
            priority=BATCH_CLASS,
            slices=tuple((pod.node, g, pod.request.gpu_milli) for g in gpus),
            at_risk=pod.gpu * since,
            started=pod.started,
        )

    def _surplus(self, pod: Pod) -> list[Holder]:
        """An elastic job's workers above MIN, one holder each
        (``scheduler.elastic.surplus_holders``), priced at the pause a shrink costs."""
        workers = [((pod.node, g, pod.request.gpu_milli),) for g in pod.gpus]
        return surplus_holders(
            str(pod.id),
            "",
            BATCH_CLASS,
            workers,
            ELASTIC_MIN,
            pause_s=self._to_boundary(pod) + self.config.save + self.config.resize_pause,
            started=pod.started,
        )

    def _kueue_classic(self, shape: int, holders: list[Holder]) -> list[Holder]:
        """Newest start first until the pod fits somewhere, then drop the unneeded
        (last added first), as Kueue's classic preemption does."""
        c = self.cluster
        gpu, cpu, mem = c.gpu_free.copy(), c.cpu_free.copy(), c.mem_free.copy()

        def give(h: Holder, sign: int) -> None:
            r = self.pods[int(h.key)].request
            for n, g, milli in h.slices:
                gpu[n, g] += sign * milli
            cpu[h.slices[0][0]] += sign * r.cpu_milli
            mem[h.slices[0][0]] += sign * r.memory_mib

        def fits() -> bool:
            return bool(self._nodes_fitting(shape, gpu, cpu, mem).any())

        chosen: list[Holder] = []
        for h in sorted(holders, key=lambda h: (-h.started, h.key)):
            give(h, +1)
            chosen.append(h)
            # only the node just freed can newly fit
            n = h.slices[0][0]
            if self._shapes_fitting_node(n, gpu[n], int(cpu[n]), int(mem[n]))[shape]:
                break
        else:
            return []
        for h in reversed(list(chosen)):
            give(h, -1)
            if fits():
                chosen.remove(h)
            else:
                give(h, +1)
        return chosen

    def _to_boundary(self, pod: Pod) -> float:
        """Seconds to the end of the training step in flight."""
        return self.config.step - ((self.now - pod.started) % self.config.step)

    def _stop_point(self, victim: Pod) -> tuple[float, float, float]:
        """Told to stop now: when it is out, the work it keeps (seconds at full size)
        and the seconds of running it loses (see the docstring)."""
        cfg, now = self.config, self.now
        to_boundary = self._to_boundary(victim)
        if self.scheme in CHECKPOINTING and to_boundary + cfg.save <= cfg.grace:
            # the step in flight is counted lost, conservatively
            return now + to_boundary + cfg.save, victim.progress(now), to_boundary + cfg.save
        exit_at = now + cfg.grace
        checkpoint = victim.last_checkpoint(now, cfg.checkpoint_interval)
        return exit_at, victim.progress(checkpoint), exit_at - checkpoint

    def _terminate(self, victim: Pod, preemptor: Pod) -> None:
        """SIGTERM: when the victim exits and what it keeps (see the docstring)."""
        self._count_batch(victim, -1)  # its room is promised to the preemptor
        victim.terminating = True
        victim.preemptor = preemptor.id
        preemptor.pending.add(victim.id)
        exit_at, saved, lost_s = self._stop_point(victim)
        if victim.finish_time() <= exit_at:
            return  # it completes first; the finish event frees it
        victim.remaining = victim.work - saved
        self.lost_gpu_s += victim.gpu * lost_s
        self._push(exit_at, EXIT, victim.id, victim.token)

    # elastic jobs ---------------------------------------------------------------------

    def _shrink(self, job: Pod, width: int, preemptor: Pod) -> None:
        """Shrink ``job`` to ``width`` workers for ``preemptor`` (see the docstring):
        its ranks stop at the step boundary with a checkpoint, the workers above
        ``width`` leave then (the preemptor waits for that, as for a victim) and the
        rest restart smaller after the resize pause."""
        exit_at, saved, lost_s = self._stop_point(job)
        if job.finish_time() <= exit_at:
            self._terminate(job, preemptor)  # it completes first: just wait for it
            return
        cfg, old = self.config, job.request
        new = width_request(job.full, width)
        self._count_batch(job, -1)
        job.giving_back = (
            job.gpus[width:],
            old.cpu_milli - new.cpu_milli,
            old.memory_mib - new.memory_mib,
        )
        job.request, job.gpus = new, job.gpus[:width]
        self._count_batch(job, +1)  # what it keeps is still preemptible
        job.preemptor = preemptor.id
        preemptor.pending.add(job.id)
        self.lost_gpu_s += old.total_gpu_milli / 1000 * lost_s + job.gpu * cfg.resize_pause
        self._restart(job, saved, exit_at + cfg.resize_pause)
        self._push(exit_at, SHRUNK, job.id, job.token)
        self.shrinks += 1

    def _restart(self, job: Pod, saved: float, at: float) -> None:
        """The job runs again from its checkpoint (``saved``) at its new size from ``at``."""
        job.remaining = job.work - saved
        job.started = at
        job.token += 1  # its old finish event no longer holds
        self._push(at, RESUMED, job.id, job.token)
        self._push(job.finish_time(), FINISH, job.id, job.token)

    def _shrunk(self, job: Pod) -> None:
        """The workers above the new size are out: their room goes to the preemptor."""
        c, n = self.cluster, job.node
        gpus, cpu, mem = job.giving_back
        for g in gpus:
            c.gpu_free[n, g] += job.request.gpu_milli
        c.cpu_free[n] += cpu
        c.mem_free[n] += mem
        self.allocated -= len(gpus) * job.request.gpu_milli
        job.giving_back = ((), 0, 0)
        self.dirty.add(n)
        self._release_preemptor(job)

    def _resumed(self, job: Pod) -> None:
        """The job runs again: it may be shrunk or stopped again, or grow."""
        self.room_dirty.add(job.node)
        self.grow_nodes.add(job.node)

    def _grow_into_free_room(self) -> None:
        """Grow running elastic jobs into the free room on their nodes.

        Only when no high pod waits: room a high pod could use is its. Waiting
        batch pods cannot use this room (the queue pass just tried them), so it
        would stay idle otherwise."""
        if self.high_waiting.any():
            return  # keep the nodes: try again once no high pod waits
        nodes, self.grow_nodes = self.grow_nodes, set()
        for n in nodes:
            for pid in sorted(self.batch_on_node[n]):
                job = self.pods[pid]
                if job.elastic and job.started <= self.now:
                    self._grow(job)

    def _grow(self, job: Pod) -> None:
        """Add the free GPUs of its node it can use, up to MAX, if that pays for the
        pause: the ranks checkpoint at the step boundary and restart larger."""
        c, n, cfg = self.cluster, job.node, self.config
        width = job.request.num_gpu
        if width >= job.full.num_gpu:
            return
        slot_ok = c.model_mask(job.full)[n]
        free = np.flatnonzero((c.gpu_free[n] >= job.full.gpu_milli) & slot_ok)
        free = [int(g) for g in free if int(g) not in job.gpus]
        new_width = min(width + len(free), job.full.num_gpu)
        while new_width > width:  # as many as the node's CPU and memory allow
            new = width_request(job.full, new_width)
            if (
                c.cpu_free[n] >= new.cpu_milli - job.request.cpu_milli
                and c.mem_free[n] >= new.memory_mib - job.request.memory_mib
            ):
                break
            new_width -= 1
        if new_width == width:
            return
        pause = self._to_boundary(job) + cfg.save + cfg.resize_pause
        left = job.work - job.progress(self.now)  # seconds at full size
        faster_by = left / job.rate - left * job.full.num_gpu / new_width
        if faster_by <= pause:
            return  # it would not finish sooner: not worth the pause
        added = tuple(free[: new_width - width])
        new = width_request(job.full, new_width)
        self._count_batch(job, -1)
        for g in added:
            c.gpu_free[n, g] -= new.gpu_milli
        c.cpu_free[n] -= new.cpu_milli - job.request.cpu_milli
        c.mem_free[n] -= new.memory_mib - job.request.memory_mib
        self.allocated += len(added) * new.gpu_milli
        saved = job.progress(self.now)  # the step in flight is counted lost, as above
        job.request, job.gpus = new, job.gpus + added
        self._count_batch(job, +1)
        self.lost_gpu_s += job.gpu * pause  # every GPU it now holds waits out the pause
        self._restart(job, saved, self.now + pause)
        self.grows += 1

    # results --------------------------------------------------------------------------

    def _result(self) -> Result:
        h = self.horizon
        high = [p for p in self.pods if p.high]
        waits = np.array([(p.first_start if p.first_start >= 0 else h) - p.arrival for p in high])
        batch = [p for p in self.pods if not p.high]
        done = [p for p in batch if p.finished >= 0]
        completion = np.array([p.finished - p.arrival for p in done]) / 3600
        return Result(
            scheme=self.scheme,
            load=self.load,
            pods=len(self.pods),
            high_wait_p50=float(np.percentile(waits, 50)) if len(waits) else 0.0,
            high_wait_p99=float(np.percentile(waits, 99)) if len(waits) else 0.0,
            batch_completion_mean_h=float(completion.mean()) if len(done) else math.nan,
            batch_completion_p50_h=float(np.median(completion)) if len(done) else math.nan,
            batch_goodput_gpu_h=sum(p.gpu_work for p in done) / 3600,
            lost_gpu_h=self.lost_gpu_s / 3600,
            preemptions=self.preemptions,
            allocation_rate=self.alloc_area / (self.capacity * h) if h > 0 else 0.0,
            batch_finished=len(done),
            batch_total=len(batch),
            shrinks=self.shrinks,
            grows=self.grows,
        )


def replay(
    nodes: Sequence[NodeSpec],
    stream: Sequence[Arrival],
    scheme: str,
    config: Config | None = None,
    horizon: float | None = None,
    load: float = 0.0,
    workload: Iterable[Request] | None = None,
) -> Result:
    """Simulate ``stream`` on ``nodes`` with one scheme until ``horizon`` (default:
    the last arrival)."""
    if horizon is None:
        horizon = max((a.time for a in stream), default=0.0)
    return Replay(nodes, stream, scheme, config or Config(), horizon, load, workload).run()


# --- the command line -------------------------------------------------------------


def run_one(
    traces: Path, hours: float, limit: int | None, config: Config, load: float, scheme: str
) -> Result:
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / "openb_pod_list_default.csv")
    capacity = sum(len(models) for *_, models in nodes)
    stream, cycle = build_stream(pods, load, capacity, hours * 3600)
    horizon = hours * 3600
    if limit is not None and limit < len(stream):
        stream = stream[:limit]
        horizon = stream[-1].time
    result = replay(nodes, stream, scheme, config, horizon, load, (p.request for p in pods))
    result.extra.update(cycle_s=cycle, horizon_s=horizon)
    return result


def elastic_summary(traces: Path) -> str:
    """How many of the trace's pods run as elastic jobs, and their share of the work."""
    pods = load_pods(traces / "openb_pod_list_default.csv")
    batch = [p for p in pods if not p.high]
    elastic = [p for p in batch if is_elastic(p.request, p.high)]

    def work(ps: list[TracePod]) -> float:
        return sum(p.request.total_gpu_milli / 1000 * p.duration for p in ps)

    return (
        f"{len(elastic)} of the trace's {len(batch)} batch GPU pods are elastic (those "
        f"asking >= 2 whole GPUs: {100 * work(elastic) / max(work(batch), 1e-9):.0f}% of "
        f"the batch GPU-seconds)"
    )


HEADER = (
    f"{'load':>4} {'policy':<14} {'pods':>6} {'hi wait p50 s':>13} {'hi wait p99 s':>13} "
    f"{'batch done h mean':>17} {'p50':>6} {'batch goodput GPU-h':>19} {'lost GPU-h':>10} "
    f"{'preempt':>7} {'shrink':>6} {'grow':>5} {'alloc':>6} {'batch done':>11} {'wall s':>7}"
)


def format_row(r: Result) -> str:
    return (
        f"{r.load:>4.1f} {r.scheme:<14} {r.pods:>6} {r.high_wait_p50:>13.1f} "
        f"{r.high_wait_p99:>13.1f} {r.batch_completion_mean_h:>17.3f} "
        f"{r.batch_completion_p50_h:>6.3f} {r.batch_goodput_gpu_h:>19.1f} "
        f"{r.lost_gpu_h:>10.2f} {r.preemptions:>7} {r.shrinks:>6} {r.grows:>5} "
        f"{r.allocation_rate:>6.3f} "
        f"{f'{r.batch_finished}/{r.batch_total}':>11} {r.wall_s:>7.1f}"
    )


def goal_checks(results: Sequence[Result], grace: float, load: float = 1.3) -> list[str]:
    """The issue's three goals at ``load``, each with its ratio."""
    at = {r.scheme: r for r in results if abs(r.load - load) < 1e-9}
    lines = []

    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    if "gpulab" in at:
        g = at["gpulab"]
        lines.append(
            f"gpulab high wait p99 = {g.high_wait_p99:.1f} s (goal <= grace {grace:.0f} s): "
            f"{verdict(g.high_wait_p99 <= grace)}"
        )
        if "priority" in at:
            ref = at["priority"].batch_goodput_gpu_h
            ratio = g.batch_goodput_gpu_h / ref if ref else math.nan
            lines.append(
                f"gpulab goodput / priority goodput = {ratio:.3f} (goal >= 0.95): "
                f"{verdict(ratio >= 0.95)}"
            )
        if "kueue-classic" in at:
            ref = at["kueue-classic"].lost_gpu_h
            ratio = g.lost_gpu_h / ref if ref else (0.0 if not g.lost_gpu_h else math.inf)
            lines.append(
                f"gpulab lost GPU-h / kueue-classic lost GPU-h = {ratio:.3f} (goal <= 0.5): "
                f"{verdict(ratio <= 0.5)}"
            )
    lines += _elastic_checks(at)
    return lines


def _elastic_checks(at: dict[str, Result]) -> list[str]:
    """The elastic goals: gpulab-elastic against priority (goodput), kueue-classic
    (lost work) and gpulab without elasticity (high wait p99)."""
    if "gpulab-elastic" not in at:
        return []
    e, lines = at["gpulab-elastic"], []

    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    if "priority" in at:
        ref = at["priority"].batch_goodput_gpu_h
        ratio = e.batch_goodput_gpu_h / ref if ref else math.nan
        lines.append(
            f"gpulab-elastic goodput / priority goodput = {ratio:.3f} (goal >= 0.95): "
            f"{verdict(ratio >= 0.95)}"
        )
    if "kueue-classic" in at:
        ref = at["kueue-classic"].lost_gpu_h
        ratio = e.lost_gpu_h / ref if ref else (0.0 if not e.lost_gpu_h else math.inf)
        lines.append(
            f"gpulab-elastic lost GPU-h / kueue-classic lost GPU-h = {ratio:.3f} "
            f"(goal <= 0.5): {verdict(ratio <= 0.5)}"
        )
    if "gpulab" in at:
        ref = at["gpulab"].high_wait_p99
        lines.append(
            f"gpulab-elastic high wait p99 = {e.high_wait_p99:.1f} s vs gpulab "
            f"{ref:.1f} s (goal: no worse): {verdict(e.high_wait_p99 <= ref)}"
        )
    return lines


def parse_list(text: str, kind=str) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=Path(os.environ.get("GPULAB_TRACES", DEFAULT_TRACES)),
        help="folder with openb_node_list_gpu_node.csv and openb_pod_list_default.csv "
        "(default ../shared/traces/alibaba-gpu-v2023 or $GPULAB_TRACES)",
    )
    parser.add_argument("--loads", type=partial(parse_list, kind=float), default=list(LOADS))
    parser.add_argument("--policies", type=parse_list, default=list(SCHEMES))
    parser.add_argument("--checkpoint-interval", type=float, default=1800.0, help="s (1800)")
    parser.add_argument("--grace", type=float, default=30.0, help="s (30)")
    parser.add_argument("--step", type=float, default=10.0, help="gpulab victims' step, s (10)")
    parser.add_argument("--save", type=float, default=5.0, help="checkpoint write, s (5)")
    parser.add_argument(
        "--resize-pause",
        type=float,
        default=10.0,
        help="an elastic job's restart at its new size, s (10)",
    )
    parser.add_argument("--hours", type=float, default=1.0, help="simulated horizon (1)")
    parser.add_argument("--placement", default="gpulab", help="placement policy (gpulab)")
    parser.add_argument("--limit", type=int, help="only the first N arrivals (quick runs)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1)")
    args = parser.parse_args(argv)
    for name in args.policies:
        if name not in SCHEMES:
            parser.error(f"unknown policy {name!r}; use one of {', '.join(SCHEMES)}")
    config = Config(
        args.checkpoint_interval,
        args.grace,
        args.step,
        args.save,
        args.placement,
        args.resize_pause,
    )

    print(
        f"priority replay: {args.traces.name}, GPU pods only, LS/Guaranteed = high (1000, "
        f"never preempted), BE/Burstable = batch (100, preemptible)\n"
        f"horizon {args.hours:g} h; load = offered GPU demand / capacity, trace arrivals sped "
        f"up and repeated; durations as in the trace; placement {args.placement}; backfill "
        f"for all\ncheckpoint every {args.checkpoint_interval:g} s of running; grace "
        f"{args.grace:g} s; gpulab victims stop at a {args.step:g} s step boundary and save "
        f"in {args.save:g} s; kueue-classic victims are killed at the grace"
        + (f"; first {args.limit} arrivals only" if args.limit else "")
        + f"\ngpulab-elastic: {elastic_summary(args.traces)}; MIN {ELASTIC_MIN} GPU, MAX as "
        f"asked, work (GPU-s) kept; a resize pauses the job to the step boundary + "
        f"{args.save:g} s save + {args.resize_pause:g} s restart"
    )
    one = partial(run_one, args.traces, args.hours, args.limit, config)
    grid = [(load, scheme) for load in args.loads for scheme in args.policies]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, *zip(*grid, strict=True)))
    else:
        results = [one(load, scheme) for load, scheme in grid]
    print(HEADER)
    for r in results:
        print(format_row(r))
    for line in goal_checks(results, args.grace):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
