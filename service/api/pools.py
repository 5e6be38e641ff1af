"""``GET /api/v1/pools``: the site's pools, in the order ``auto`` tries them, with how
many slices of each size are free in each now (the lab panel and ``%gpulab`` show it).

Every signed-in user may read it: it says where GPUs are and how full, as the
inventory does, and nothing of who holds them.
"""

from __future__ import annotations

from gpulab.service.auth import APIHandler


class PoolsHandler(APIHandler):
    async def get(self):
        self.require_identity()
        svc = self.gpulab
        pools = []
        for pool in svc.site_pools.list:
            view = svc.ledger.pool(pool.name)
            per_node = await view.aio.free_sizes(svc.inventory_settings.slice_sizes)
            free = {}
            for sizes in per_node.values():
                for s in sizes:
                    entry = free.setdefault(s["milli"], {**s, "count": 0})
                    entry["count"] += s["count"]
            pools.append(
                {
                    **pool.describe(),
                    "nodes": sorted({g.node for g in pool.gpus}),
                    "free": [free[m] for m in sorted(free)],
                    "reason": pool.reason,
                }
            )
        self.write_json(
            {
                "default": svc.site_pools.default,
                "servers": svc.server_pool_name,
                "endpoints": svc.pool_for("deployment"),
                "pools": pools,
            }
        )


routes = [(r"api/v1/pools", PoolsHandler)]
