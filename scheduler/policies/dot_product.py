"""Dot-product (Tetris): prefer the node whose free resources least align with the request.

The paper's "DotProd" baseline in its published configuration: the node's free
(CPU, total GPU) and the request's (CPU, total GPU), both normalised by the
largest node spec; the smaller their dot product, the higher the score, so
requests go where they leave the most complementary room. GPUs on the chosen
node are picked best-fit.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Request, register_policy
from .choice import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, ScoredNodePolicy


def dot_product_scores(cluster: Cluster, request: Request) -> np.ndarray:
    """(N,) integer scores, higher = smaller alignment of free room and request."""
    dot = (cluster.cpu_free / MAX_SPEC_CPU) * (request.cpu_milli / MAX_SPEC_CPU) + (
        cluster.gpu_free.sum(axis=1) / MAX_SPEC_GPU
    ) * (request.total_gpu_milli / MAX_SPEC_GPU)
    return np.trunc((1.0 - dot / 2) * MAX_NODE_SCORE)


@register_policy("dot-product")
class DotProduct(ScoredNodePolicy):
    def scores(self, cluster: Cluster, request: Request) -> np.ndarray:
        return dot_product_scores(cluster, request)
