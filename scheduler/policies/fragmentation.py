"""GPU fragmentation against a typical task mix (Weng et al., USENIX ATC'23).

A node's free GPU milli is *fragmented* for a task type when that type cannot
use it: all of it when the node cannot host the type at all (wrong GPU model,
too few fitting GPUs, too little CPU), otherwise the free milli of the GPUs
that are individually too small for one share of the type. A CPU-only type can
use no GPU, so for it every free milli is fragmented. The node's fragmentation
is the expectation over the *typical mix* (task types weighted by popularity).

Written so that it vectorises: with ``T`` the node's free milli and, for each
GPU type ``k`` of weight ``p_k``, ``U_k`` the free milli on GPUs with at least
``d_k`` free,

    F(node) = T - sum_k p_k * ok_k(node) * U_k(node)

because the weights sum to one. ``U`` and the count of fitting GPUs depend on
``d_k`` only, so they are tabled per distinct share size ("threshold");
types that differ only in CPU fold into one *group* whose weight is a step
function of the node's free CPU. A placement changes ``T``, ``U`` and the
counts by amounts that depend only on the free milli of the GPUs it uses,
which is how :meth:`FragState.after` scores thousands of candidate placements
in a few array operations.

As in the paper's simulator, host memory does not enter the measure; a
policy that wants it can filter on memory itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..policy import NO_GPU, Cluster, Request
from ..slices import DEFAULT_SLICE_SIZES, MILLI_PER_GPU, shape_of

#: Share of all tasks the typical mix covers, most popular types first (the paper's 95%).
POPULARITY = 0.95


@dataclass(frozen=True)
class TaskType:
    """One kind of task in the mix: a request shape and its probability."""

    gpu_milli: int
    num_gpu: int
    cpu_milli: int
    gpu_models: frozenset[str] | None
    weight: float


class TypicalMix:
    """The task types a cluster expects, with their popularity (weights sum to 1)."""

    def __init__(self, types: Sequence[TaskType]):
        total = sum(t.weight for t in types)
        if not types or total <= 0:
            raise ValueError("a typical mix needs at least one task type with positive weight")
        self.types = [
            TaskType(t.gpu_milli, t.num_gpu, t.cpu_milli, t.gpu_models, t.weight / total)
            for t in types
        ]

    @classmethod
    def from_workload(
        cls, requests: Iterable[Request], popularity: float = POPULARITY
    ) -> TypicalMix:
        """The most popular request shapes that together cover ``popularity`` of the tasks.

        Shapes are (CPU, per-GPU milli, GPU count, model constraint); memory is
        left out as in the paper. Ties in count are ordered by shape so the cut
        is deterministic.
        """
        counts = Counter(
            (r.cpu_milli, r.gpu_milli if r.num_gpu else 0, r.num_gpu, _spec_key(r.gpu_models))
            for r in requests
        )
        if not counts:
            return cls.default()
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        total = sum(counts.values())
        kept, covered = [], 0
        for shape, n in ranked:
            kept.append((shape, n))
            covered += n
            if covered >= popularity * total:
                break
        return cls(
            [
                TaskType(milli, num, cpu, frozenset(spec) if spec else None, float(n))
                for (cpu, milli, num, spec), n in kept
            ]
        )

    @classmethod
    def default(cls) -> TypicalMix:
        """For a cluster with no history: the spawn form's sizes, equally likely."""
        types = []
        for size in DEFAULT_SLICE_SIZES:
            shape = shape_of(size)
            if shape.num_gpus:
                types.append(TaskType(shape.milli_per_gpu, shape.num_gpus, 0, None, 1.0))
        return cls(types)


def _spec_key(models: frozenset[str] | None) -> tuple[str, ...]:
    return tuple(sorted(models)) if models else ()


class MixTables:
    """A :class:`TypicalMix` compiled against one cluster's GPU models."""

    def __init__(self, mix: TypicalMix, cluster: Cluster):
        gpu_types = [t for t in mix.types if t.num_gpu > 0]
        self.thresholds = np.array(sorted({t.gpu_milli for t in gpu_types}), dtype=np.int64)
        groups: dict[tuple, list[TaskType]] = {}
        for t in gpu_types:
            groups.setdefault((t.gpu_milli, t.num_gpu, _spec_key(t.gpu_models)), []).append(t)
        keys = list(groups)
        self.group_threshold = np.array(
            [int(np.searchsorted(self.thresholds, k[0])) for k in keys], dtype=np.int64
        )
        self.group_num = np.array([k[1] for k in keys], dtype=np.int64)
        # Free CPU decides which of a group's CPU variants a node can host:
        # W[i, g] = weight of group g's variants needing at most cpu_levels[i-1].
        self.cpu_levels = np.array(sorted({t.cpu_milli for t in gpu_types}), dtype=np.int64)
        self.cpu_weight = np.zeros((len(self.cpu_levels) + 1, len(keys)))
        for g, key in enumerate(keys):
            for t in groups[key]:
                i = int(np.searchsorted(self.cpu_levels, t.cpu_milli)) + 1
                self.cpu_weight[i:, g] += t.weight
        # A node can serve a group when every GPU it has is of an accepted model
        # (nodes are homogeneous in practice; the paper keys access on the node's model).
        exists = cluster.gpu_model != NO_GPU
        self.access = np.zeros((len(cluster.cpu_free), len(keys)), dtype=bool)
        for g, key in enumerate(keys):
            spec = set(key[2])
            if spec:
                accepted = [i for i, m in enumerate(cluster.models) if m in spec]
                ok = np.isin(cluster.gpu_model, accepted) | ~exists
            else:
                ok = np.ones_like(exists)
            self.access[:, g] = ok.all(axis=1) & exists.any(axis=1)

    def weights(self, nodes: np.ndarray, cpu_free: np.ndarray) -> np.ndarray:
        """(C, groups): each group's weight a node of ``cpu_free`` can host, 0 if no access."""
        level = np.searchsorted(self.cpu_levels, cpu_free, side="right")
        return self.cpu_weight[level] * self.access[nodes]


class FragState:
    """Per-node fragmentation of a cluster, kept up to date cheaply.

    It remembers the free arrays it last saw and recomputes only the nodes
    whose resources changed, so a policy or a replay can ask for it after
    every placement without rescanning the cluster.
    """

    def __init__(self, mix: TypicalMix, cluster: Cluster):
        self.tables = MixTables(mix, cluster)
        self.cluster = cluster
        n = len(cluster.cpu_free)
        self._gpu_seen = cluster.gpu_free.copy()
        self._cpu_seen = cluster.cpu_free.copy()
        self.free_total = np.zeros(n, dtype=np.int64)
        self.usable = np.zeros((n, len(self.tables.thresholds)), dtype=np.int64)
        self.fitting = np.zeros((n, len(self.tables.thresholds)), dtype=np.int64)
        self.frag = np.zeros(n)
        # A node's fragmentation after a placement depends only on its state
        # and the GPUs used, and many nodes share a state (all the untouched
        # ones of a kind), so candidates are scored once per distinct
        # (state, GPUs used). A random 64-bit hash names each state.
        width = 2 + 2 * len(self.tables.thresholds)
        mixer = np.random.default_rng(0x6770756C6162)
        self._mult = mixer.integers(1, 2**62, size=width + 1, dtype=np.int64) | 1
        access = self.tables.access.astype(np.int64)
        self._static = (
            access * mixer.integers(1, 2**62, size=access.shape[1], dtype=np.int64)
        ).sum(axis=1)
        self.signature = np.zeros(n, dtype=np.int64)
        self._recompute(np.arange(n))

    def sync(self) -> None:
        """Catch up with changes made to the cluster since the last call."""
        c = self.cluster
        changed = np.flatnonzero(
            (c.gpu_free != self._gpu_seen).any(axis=1) | (c.cpu_free != self._cpu_seen)
        )
        if len(changed):
            self._recompute(changed)

    def _recompute(self, rows: np.ndarray) -> None:
        c = self.cluster
        free = c.gpu_free[rows]
        self._gpu_seen[rows] = free
        self._cpu_seen[rows] = c.cpu_free[rows]
        fits = free[:, :, None] >= self.tables.thresholds[None, None, :]
        self.free_total[rows] = free.sum(axis=1)
        self.usable[rows] = (free[:, :, None] * fits).sum(axis=1)
        self.fitting[rows] = fits.sum(axis=1)
        self.frag[rows] = self._frag(
            rows, c.cpu_free[rows], self.free_total[rows], self.usable[rows], self.fitting[rows]
        )
        state = np.column_stack(
            [c.cpu_free[rows], self.free_total[rows], self.usable[rows], self.fitting[rows]]
        )
        with np.errstate(over="ignore"):
            self.signature[rows] = (state * self._mult[:-1]).sum(axis=1) + self._static[rows]

    def _frag(self, nodes, cpu, total, usable, fitting) -> np.ndarray:
        t = self.tables
        hosts = fitting[:, t.group_threshold] >= t.group_num
        served = (t.weights(nodes, cpu) * hosts * usable[:, t.group_threshold]).sum(axis=1)
        return total - served

    def after(self, nodes: np.ndarray, used: np.ndarray, share: int, cpu: int) -> np.ndarray:
        """Fragmentation of ``nodes`` after each takes ``share`` milli from GPUs whose
        free milli is ``used`` (C, m) and ``cpu`` milli-CPU; one row per candidate."""
        used = np.asarray(used, dtype=np.int64)
        if len(nodes) < 64:
            return self._after(nodes, used, share, cpu)
        key = self.signature[nodes].copy()
        with np.errstate(over="ignore"):
            for column in np.sort(used, axis=1).T:  # the GPUs used, as a multiset
                key = key * self._mult[-1] + column
        _, first, back = np.unique(key, return_index=True, return_inverse=True)
        return self._after(nodes[first], used[first], share, cpu)[back]

    def _after(self, nodes: np.ndarray, used: np.ndarray, share: int, cpu: int) -> np.ndarray:
        t = self.tables
        left = used - share
        th = t.thresholds[None, None, :]
        before_fit = used[:, :, None] >= th
        after_fit = left[:, :, None] >= th
        usable = self.usable[nodes] + (
            left[:, :, None] * after_fit - used[:, :, None] * before_fit
        ).sum(axis=1)
        fitting = self.fitting[nodes] + (after_fit.astype(np.int64) - before_fit).sum(axis=1)
        total = self.free_total[nodes] - share * used.shape[1]
        return self._frag(nodes, self.cluster.cpu_free[nodes] - cpu, total, usable, fitting)


def cluster_frag_pct(state: FragState) -> float:
    """Fragmented GPU as a percentage of the cluster's GPU capacity."""
    capacity = (state.cluster.gpu_model != NO_GPU).sum() * MILLI_PER_GPU
    return 100.0 * float(state.frag.sum()) / capacity if capacity else 0.0
