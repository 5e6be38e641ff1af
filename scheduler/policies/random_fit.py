"""Random: any node that fits, any GPU on it that fits.

The floor every other policy is measured against: it packs nothing on purpose,
so what it wastes is what fragmentation costs when nobody minds it.
"""

from __future__ import annotations

import numpy as np

from ..policy import Cluster, Placement, PlacementPolicy, Request, register_policy
from .choice import random_gpus


@register_policy("random")
class RandomFit(PlacementPolicy):
    def place(self, cluster: Cluster, request: Request) -> Placement | None:
        feasible = np.flatnonzero(cluster.feasible_nodes(request))
        if not len(feasible):
            return None
        node = int(self.rng.choice(feasible))
        return Placement(node, random_gpus(cluster, node, request, self.rng))
