"""Every way a request could be placed, as arrays a policy can score at once.

A fraction may go on any fitting GPU of any feasible node, and which GPU
matters (it decides what is left on that card), so each (node, GPU) pair is a
candidate. A whole-GPU or CPU-only request has one candidate per node: the
empty cards it would take are interchangeable, so the first fitting ones stand
for all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..policy import Cluster, Request
from .choice import is_fraction


@dataclass
class Candidates:
    nodes: np.ndarray  # (C,) node index
    gpus: np.ndarray  # (C, num_gpu) GPU slots the request would take
    used: np.ndarray  # (C, num_gpu) free milli of those slots before placing

    def __len__(self) -> int:
        return len(self.nodes)


def enumerate_candidates(cluster: Cluster, request: Request) -> Candidates:
    feasible = cluster.feasible_nodes(request)
    if is_fraction(request):
        nodes, slots = np.nonzero(cluster.eligible_gpus(request) & feasible[:, None])
        gpus = slots[:, None]
    else:
        nodes = np.flatnonzero(feasible)
        if request.num_gpu:
            eligible = cluster.eligible_gpus(request)[nodes]
            free = np.where(eligible, cluster.gpu_free[nodes], np.iinfo(np.int64).max)
            gpus = np.argsort(free, axis=1, kind="stable")[:, : request.num_gpu]
        else:
            gpus = np.zeros((len(nodes), 0), dtype=np.int64)
    used = cluster.gpu_free[nodes[:, None], gpus]
    return Candidates(nodes, gpus, used)
