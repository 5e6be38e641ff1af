"""GPU packing: share a used card first, then empty cards on a used node, then a fresh node.

The paper's "GpuPacking" baseline. Three tiers, best first:

1. the request fits on cards that are already shared: the less free room they
   keep, the better;
2. it needs empty cards, but on a node that is already in use: the fewer empty
   cards it takes, the better;
3. the node is untouched: smaller nodes first, so big nodes stay whole.

CPU-only requests score the same everywhere (random node). GPUs on the chosen
node are picked best-fit.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Request, register_policy
from ..slices import MILLI_PER_GPU
from .choice import MAX_NODE_SCORE, ScoredNodePolicy


def packing_scores(cluster: Cluster, request: Request) -> np.ndarray:
    """(N,) integer tier scores as the paper's plugin computes them (higher = better)."""
    n = len(cluster.cpu_free)
    if request.num_gpu == 0:
        return np.zeros(n)
    exists = cluster.gpu_exists
    empty = (cluster.gpu_free == MILLI_PER_GPU) & exists
    n_empty = empty.sum(axis=1)
    n_gpus = exists.sum(axis=1)
    # The GPUs best-fit would take: the tightest fitting ones.
    eligible = cluster.eligible_gpus(request)
    free = np.where(eligible, cluster.gpu_free, np.iinfo(np.int32).max)
    taken = np.sort(free, axis=1)[:, : request.num_gpu]
    taken_ok = taken <= MILLI_PER_GPU
    empties_taken = ((taken == MILLI_PER_GPU) & taken_ok).sum(axis=1)
    shared_room = (np.where(taken_ok, taken, 0) * 100 // MILLI_PER_GPU).sum(axis=1)
    third, half = MAX_NODE_SCORE // 3, MAX_NODE_SCORE // 2
    fresh = np.maximum(third - n_empty, n_empty)
    on_used_node = np.maximum(half - empties_taken, third)
    on_shared = np.maximum(MAX_NODE_SCORE - shared_room // 10, half)
    score = np.where(empties_taken > 0, on_used_node, on_shared)
    return np.where(n_empty == n_gpus, fresh, score).astype(float)


@register_policy("packing")
class GpuPacking(ScoredNodePolicy):
    def scores(self, cluster: Cluster, request: Request) -> np.ndarray:
        return packing_scores(cluster, request)
