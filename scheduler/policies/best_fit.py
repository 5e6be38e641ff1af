"""Best-fit: put a request where it leaves the least free GPU behind.

Among feasible nodes, pick the one whose GPUs would be fullest after placing;
on that node, take the fitting GPUs with the least free milli. Fractions
therefore fill partly used cards before they touch an empty one, which keeps
whole cards free for whole-card requests.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Placement, PlacementPolicy, Request, register_policy


def pick_tightest_gpus(cluster: Cluster, node: int, request: Request) -> tuple[int, ...]:
    """The ``num_gpu`` fitting GPUs of ``node`` with the least free milli."""
    eligible = cluster.eligible_gpus(request)[node]
    free = np.where(eligible, cluster.gpu_free[node], np.iinfo(np.int64).max)
    order = np.argsort(free, kind="stable")
    return tuple(int(g) for g in order[: request.num_gpu])


@register_policy("best-fit")
class BestFit(PlacementPolicy):
    def place(self, cluster: Cluster, request: Request) -> Placement | None:
        feasible = cluster.feasible_nodes(request)
        if not feasible.any():
            return None
        if request.num_gpu == 0:
            # CPU-only: the node with the least free CPU that fits.
            score = np.where(feasible, cluster.cpu_free, np.iinfo(np.int64).max)
            return Placement(int(np.argmin(score)))
        eligible = cluster.eligible_gpus(request)
        # Per node, the free milli left on the GPUs we would use, summed.
        free = np.where(eligible, cluster.gpu_free, np.iinfo(np.int32).max)
        tightest = np.sort(free, axis=1)[:, : request.num_gpu]
        leftover = (tightest - request.gpu_milli).sum(axis=1)
        leftover = np.where(feasible, leftover, np.iinfo(np.int64).max)
        node = int(np.argmin(leftover))
        return Placement(node, pick_tightest_gpus(cluster, node, request))
