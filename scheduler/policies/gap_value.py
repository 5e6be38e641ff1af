"""What a card's free milli will be worth: the waste it is expected to end as.

A slice leaves a *gap* on its card, and whether that gap is ever used depends
on two things FGD's one-task look-ahead does not weigh: whether the workload
has a size that fills it *well* (a 0.22 slice in a 0.22 gap wastes nothing, a
0.23 slice in a 0.35 gap strands 0.12), and whether enough such slices will
still arrive, given how many other gaps are waiting for the same size (the
trace's 0.81 slices leave about a thousand 0.19 gaps, and only about a hundred
slices small enough for one ever come).

``V[h]`` is the expected milli that a gap of ``h`` ends up wasting::

    V[h] = min over sizes s <= h of  pi_s * V[h - s] + (1 - pi_s) * h      (h if none fits)

that is, the gap waits for the size that serves it best, and gets one with
probability ``pi_s``: the slices of size ``s`` expected before the cluster is
full (its free milli over the mean request, times the size's share of the
workload, times :data:`HORIZON`), over the gaps now waiting for ``s``
(every gap of the cluster follows its own best chain of sizes, and each size
on a chain counts as wanted once). ``pi`` and ``V`` depend on each other; a
few damped rounds settle them.

A slice placed in a gap of ``g`` then costs ``V[g - s] - V[g]`` (an empty
card's gap counts as worth nothing lost yet), so it goes where it completes a
card, or where it leaves a gap that a size still coming will fill, rather
than into the tightest gap whatever it leaves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from ..policy import NO_GPU, Cluster, Request
from ..slices import MILLI_PER_GPU
from .fragmentation import TypicalMix

#: Share of the slices still to come that a waiting gap can count on. The free
#: milli over the mean request counts every task until the cluster is full,
#: but a gap competes for them with fresh cards and with gaps opened later,
#: and it must be filled before the cluster stops accepting work. On the
#: default trace (seeds 42-51, unallocated GPU at 100% arrival) 0.1 gives
#: 3.98%, 0.15-0.4 3.93-3.95%; before the damping, 1 left gaps waiting
#: (4.1-4.4% on seeds 42-44) and 0 (every gap counts as lost) gave 4.2%.
HORIZON = 0.2
#: Damped rounds of the pi <-> V fixed point (undamped, it oscillates).
ROUNDS = 4
DAMPING = 0.5
#: Recompute the table after this many uses (slices placed): the gap
#: histogram moves slowly, and the table costs about 2 ms.
REFRESH = 64


class GapValue:
    """Expected final waste of a gap, from the workload's slice sizes and the cluster's gaps."""

    def __init__(self, sizes: dict[int, float], mean_milli: float, horizon: float = HORIZON):
        """``sizes``: slice size (milli, 1..999) -> share of all tasks; ``mean_milli``: the mean
        GPU milli of one task of the workload (whole, fractional and CPU-only together)."""
        kept = sorted(s for s, p in sizes.items() if 0 < s < MILLI_PER_GPU and p > 0)
        self.sizes = np.array(kept, dtype=np.int64)
        self.share = np.array([sizes[s] for s in kept], dtype=float)
        self.mean_milli = max(float(mean_milli), 1.0)
        self.horizon = horizon
        self._table: np.ndarray | None = None
        self._shape: tuple[int, ...] = ()
        self._uses = 0

    @classmethod
    def from_workload(cls, requests: Iterable[Request], mix: TypicalMix | None = None) -> GapValue:
        """Sizes and shares of the single-GPU slices among the workload's tasks; with no
        workload, of the typical mix (the spawn form's sizes on a fresh install)."""
        tasks = list(requests)
        if tasks:
            counts = Counter(
                r.gpu_milli for r in tasks if r.num_gpu == 1 and r.gpu_milli < MILLI_PER_GPU
            )
            mean = sum(r.total_gpu_milli for r in tasks) / len(tasks)
            return cls({s: n / len(tasks) for s, n in counts.items()}, mean)
        mix = mix or TypicalMix.default()
        shares: Counter = Counter()
        for t in mix.types:
            if t.num_gpu == 1 and t.gpu_milli < MILLI_PER_GPU:
                shares[t.gpu_milli] += t.weight
        return cls(dict(shares), sum(t.weight * t.gpu_milli * t.num_gpu for t in mix.types))

    def cost(self, cluster: Cluster, free: np.ndarray, share: int) -> np.ndarray:
        """Expected waste added by taking ``share`` milli from cards with ``free`` milli free."""
        table = self.table(cluster)
        free = np.asarray(free, dtype=np.int64)
        before = np.where(free >= MILLI_PER_GPU, 0.0, table[np.minimum(free, MILLI_PER_GPU)])
        return table[free - share] - before

    def table(self, cluster: Cluster) -> np.ndarray:
        """``V`` for gaps 0..1000 milli; recomputed every :data:`REFRESH` uses, and
        at once for a cluster of another size."""
        if (
            self._table is None
            or self._uses % REFRESH == 0
            or cluster.gpu_free.shape != self._shape
        ):
            self._table = self.compute(cluster)
            self._shape = cluster.gpu_free.shape
        self._uses += 1
        return self._table

    def compute(self, cluster: Cluster) -> np.ndarray:
        free = cluster.gpu_free[cluster.gpu_model != NO_GPU]
        waiting = np.bincount(free, minlength=MILLI_PER_GPU + 1)[: MILLI_PER_GPU + 1].astype(float)
        waiting[0] = waiting[MILLI_PER_GPU] = 0  # full and empty cards wait for nothing
        supply = self.horizon * free.sum() / self.mean_milli * self.share
        pi = np.ones(len(self.sizes))
        for _ in range(ROUNDS):
            table, best = self._solve(pi)
            fresh = np.minimum(1.0, supply / np.maximum(self._wanted(best, waiting), 1.0))
            pi = DAMPING * pi + (1 - DAMPING) * fresh
        return self._solve(pi)[0]

    def _solve(self, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``V`` for every gap, and the index of the size each gap waits for
        (``len(sizes)``: none)."""
        sizes, none = self.sizes, len(self.sizes)
        table = np.arange(MILLI_PER_GPU + 1, dtype=float)
        best = np.full(MILLI_PER_GPU + 1, none, dtype=np.int64)
        if not none:
            return table, best
        # V[h] only needs V below h - smallest size, so blocks that wide are solved at once.
        step = int(sizes[0])
        for start in range(step, MILLI_PER_GPU + 1, step):
            h = np.arange(start, min(start + step, MILLI_PER_GPU + 1))
            fits = sizes[None, :] <= h[:, None]
            left = np.where(fits, h[:, None] - sizes[None, :], 0)
            cost = np.where(fits, pi * table[left] + (1 - pi) * h[:, None], np.inf)
            pick = np.argmin(cost, axis=1)
            value = cost[np.arange(len(h)), pick]
            gain = value < h
            table[h] = np.where(gain, value, h)
            best[h] = np.where(gain, pick, none)
        return table, best

    def _wanted(self, best: np.ndarray, waiting: np.ndarray) -> np.ndarray:
        """How many waiting gaps want each size, following each gap's chain of best sizes."""
        none = len(self.sizes)
        wanted = np.zeros(none + 1)
        gap = np.flatnonzero(waiting)
        count = waiting[gap]
        while len(gap):
            want = best[gap]
            wanted += np.bincount(want, weights=count, minlength=none + 1)
            go = want < none
            gap, count = gap[go] - self.sizes[want[go]], count[go]
            go = gap > 0
            gap, count = gap[go], count[go]
        return wanted[:none]
