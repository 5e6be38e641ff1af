"""Best-fit: put a request where it leaves the least CPU and GPU behind.

The paper's baseline: a node's score is how little would be left, CPU and
GPU weighted equally, each normalised by the largest node spec; the GPUs on
the node are then chosen best-fit too (the fitting GPU with the least free
milli, empty cards for whole-GPU shares). Fractions therefore fill partly used
cards before they touch an empty one, which keeps whole cards for whole-card
requests.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Request, register_policy
from .choice import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, ScoredNodePolicy, tightest_gpus


def pick_tightest_gpus(cluster: Cluster, node: int, request: Request) -> tuple[int, ...]:
    """The ``num_gpu`` fitting GPUs of ``node`` with the least free milli."""
    return tightest_gpus(cluster, node, request)


def best_fit_scores(cluster: Cluster, request: Request) -> np.ndarray:
    """(N,) integer scores, higher = tighter fit (Kubernetes' 0..100 scale)."""
    cpu_left = (cluster.cpu_free - request.cpu_milli) / MAX_SPEC_CPU
    gpu_left = (cluster.gpu_free.sum(axis=1) - request.total_gpu_milli) / MAX_SPEC_GPU
    return np.trunc((1.0 - 0.5 * cpu_left - 0.5 * gpu_left) * MAX_NODE_SCORE)


@register_policy("best-fit")
class BestFit(ScoredNodePolicy):
    def scores(self, cluster: Cluster, request: Request) -> np.ndarray:
        return best_fit_scores(cluster, request)
