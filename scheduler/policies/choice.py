"""Small decisions every policy shares: breaking ties, picking GPUs on a node.

The published baselines (Weng et al., ATC'23) run as Kubernetes score plugins:
each node gets an integer score 0..100, and among the nodes with the top score
their simulator takes the first in a node order it shuffles once per seed.
Reproducing their numbers needs that same coarse score and that same
tie-break: a *fixed* random order concentrates tied work on the same nodes
(first-fit-like), where a fresh random pick per task would spread it.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Placement, PlacementPolicy, Request
from ..slices import MILLI_PER_GPU

#: Kubernetes' node score range.
MAX_NODE_SCORE = 100

#: The largest node in the published trace; the baselines normalise by it.
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8 * MILLI_PER_GPU


class NodeOrder:
    """A random but fixed priority of nodes, drawn once per policy and cluster size."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.rank = np.zeros(0, dtype=np.int64)

    def of(self, n: int) -> np.ndarray:
        if len(self.rank) != n:
            self.rank = self.rng.permutation(n)
        return self.rank


def pick_top(scores: np.ndarray, candidates: np.ndarray, rank: np.ndarray) -> int:
    """Node index of the top score among ``candidates``; ties go to the lowest ``rank``."""
    masked = np.where(candidates, scores, -np.inf)
    top = np.flatnonzero(masked == masked.max())
    return int(top[0]) if len(top) == 1 else int(top[np.argmin(rank[top])])


def tightest_gpus(cluster: Cluster, node: int, request: Request) -> tuple[int, ...]:
    """The ``num_gpu`` fitting GPUs of ``node`` with the least free milli, lowest index first.

    For whole-GPU shares only empty cards fit, so this takes the first empty
    ones; for a fraction it is best-fit at the GPU level.
    """
    if request.num_gpu == 0:
        return ()
    eligible = cluster.eligible_gpus(request)[node]
    free = np.where(eligible, cluster.gpu_free[node], np.iinfo(np.int64).max)
    order = np.argsort(free, kind="stable")
    return tuple(int(g) for g in order[: request.num_gpu])


def random_gpus(
    cluster: Cluster, node: int, request: Request, rng: np.random.Generator
) -> tuple[int, ...]:
    """A random fitting GPU for a fraction; whole GPUs as :func:`tightest_gpus`."""
    if request.num_gpu != 1 or request.gpu_milli >= MILLI_PER_GPU:
        return tightest_gpus(cluster, node, request)
    fitting = np.flatnonzero(cluster.eligible_gpus(request)[node])
    return (int(rng.choice(fitting)),)


def is_fraction(request: Request) -> bool:
    """One GPU, shared: the only shape whose GPU choice on a node matters for fit."""
    return request.num_gpu == 1 and request.gpu_milli < MILLI_PER_GPU


class ScoredNodePolicy(PlacementPolicy):
    """A policy that scores every node, takes the best feasible one (ties in a
    fixed random node order, as the paper's simulator does) and the tightest
    GPUs on it. Subclasses define :meth:`scores`."""

    def __init__(self, workload=None, seed: int = 0):
        super().__init__(workload, seed)
        self.order = NodeOrder(self.rng)

    def scores(self, cluster: Cluster, request: Request) -> np.ndarray:
        """(N,) scores, higher is better."""
        raise NotImplementedError

    def place(self, cluster: Cluster, request: Request) -> Placement | None:
        feasible = cluster.feasible_nodes(request)
        if not feasible.any():
            return None
        node = pick_top(self.scores(cluster, request), feasible, self.order.of(len(feasible)))
        return Placement(node, tightest_gpus(cluster, node, request))
