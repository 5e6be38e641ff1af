"""Replay a GPU-sharing trace against a placement policy, as the FGD paper does.

The protocol (Weng et al., USENIX ATC'23, and their simulator):

1. shuffle the trace's tasks with a seed, then *inflate*: draw tasks uniformly
   with replacement and append them until the total GPU request would pass
   ``inflate`` x the cluster's GPU capacity;
2. schedule the tasks one at a time in that order; a task that fits nowhere
   fails (no queue, no retry) and tasks never leave;
3. after each task, note how much of the arrived workload is in (GPU milli
   asked so far / capacity), the unallocated GPU and the fragmented GPU; a
   level such as 100% reports the mean over the tasks whose arrived workload
   rounds to it.

Fragmentation is measured against the *original* trace's typical mix, the same
mix the FGD policy is given as its workload.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .policies.fragmentation import FragState, TypicalMix
from .policy import NO_GPU, Cluster, Request, get_policy
from .slices import MILLI_PER_GPU

#: The arrival levels the paper's tables report, in % of GPU capacity.
LEVELS = (50, 70, 80, 90, 95, 100, 110, 120, 130)

NodeSpec = tuple[str, int, int, list[str]]


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes of an ``openb_node_list_*.csv``: (name, cpu_milli, memory_mib, GPU models)."""
    with open(path, newline="") as f:
        return [
            (
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                [row["model"]] * int(row["gpu"]),
            )
            for row in csv.DictReader(f)
        ]


def load_tasks(path: str | Path) -> list[Request]:
    """Tasks of an ``openb_pod_list_*.csv`` as requests (``gpu_spec`` ``A|B`` -> models)."""
    with open(path, newline="") as f:
        return [_request(row) for row in csv.DictReader(f)]


def _request(row: dict) -> Request:
    num = int(row["num_gpu"])
    spec = (row.get("gpu_spec") or "").strip()
    models = frozenset(m for m in spec.split("|") if m) if spec else None
    return Request(
        gpu_milli=int(row["gpu_milli"]) if num else 0,
        num_gpu=num,
        cpu_milli=int(row["cpu_milli"]),
        memory_mib=int(row["memory_mib"]),
        gpu_models=models or None,
    )


def gpu_capacity(nodes: Sequence[NodeSpec]) -> int:
    return sum(len(models) for *_, models in nodes) * MILLI_PER_GPU


def inflate(tasks: Sequence[Request], capacity: int, ratio: float, seed: int) -> list[Request]:
    """Shuffle ``tasks``, then append random draws until the GPU asked would pass
    ``ratio`` x capacity."""
    rng = np.random.default_rng(seed)
    order = [tasks[i] for i in rng.permutation(len(tasks))]
    target = ratio * capacity
    asked = sum(t.total_gpu_milli for t in order)
    while True:
        extra = tasks[int(rng.integers(len(tasks)))]
        if asked + extra.total_gpu_milli > target:
            return order
        order.append(extra)
        asked += extra.total_gpu_milli


@dataclass
class ReplayResult:
    """One replay: per-level means and every decision's latency."""

    policy: str
    seed: int
    unallocated_pct: dict[int, float]
    fragmented_pct: dict[int, float]
    decision_ms: np.ndarray  # wall clock per place() call
    decision_cpu_ms: (
        np.ndarray
    )  # CPU time of the calling thread: what the policy costs on a busy machine
    failed_tasks: int
    tasks: int
    failed_gpu_milli: int = 0
    extra: dict = field(default_factory=dict)


def replay(
    nodes: Sequence[NodeSpec],
    trace: Sequence[Request],
    policy: str,
    seed: int,
    ratio: float = 1.3,
    levels: Sequence[int] = LEVELS,
    limit: int | None = None,
    **policy_kwargs,
) -> ReplayResult:
    """Run the protocol once. ``limit`` stops after that many tasks (for smoke tests)."""
    cluster = Cluster.build(nodes)
    capacity = int((cluster.gpu_model != NO_GPU).sum()) * MILLI_PER_GPU
    tasks = inflate(trace, capacity, ratio, seed)[:limit]
    placer = get_policy(policy, workload=trace, seed=seed, **policy_kwargs)
    meter = FragState(TypicalMix.from_workload(trace), cluster)

    want = set(levels)
    sums = {lv: [0.0, 0.0, 0] for lv in want}  # unallocated, fragmented, count
    latency = np.empty(len(tasks))
    cpu_time = np.empty(len(tasks))
    arrived = allocated = failed = failed_milli = 0
    for i, task in enumerate(tasks):
        arrived += task.total_gpu_milli
        start, start_cpu = time.perf_counter(), time.thread_time()
        placement = placer.place(cluster, task)
        latency[i] = time.perf_counter() - start
        cpu_time[i] = time.thread_time() - start_cpu
        if placement is None:
            failed += 1
            failed_milli += task.total_gpu_milli
        else:
            cluster.apply(placement, task)
            allocated += task.total_gpu_milli
            meter.sync()
        level = int(np.round(100.0 * arrived / capacity))
        if level in want:
            acc = sums[level]
            acc[0] += 100.0 - 100.0 * allocated / capacity
            acc[1] += 100.0 * float(meter.frag.sum()) / capacity
            acc[2] += 1
    return ReplayResult(
        policy=policy,
        seed=seed,
        unallocated_pct={lv: s[0] / s[2] for lv, s in sorted(sums.items()) if s[2]},
        fragmented_pct={lv: s[1] / s[2] for lv, s in sorted(sums.items()) if s[2]},
        decision_ms=latency * 1000.0,
        decision_cpu_ms=cpu_time * 1000.0,
        failed_tasks=failed,
        tasks=len(tasks),
        failed_gpu_milli=failed_milli,
    )
