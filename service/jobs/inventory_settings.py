"""The site's GPUs and how slices are placed on them (``c.InventorySettings.<name>``):
where the GPUs come from (an inventory class, declared GPUs, the site's pools), this
node's name, the slice sizes offered and the placement policy. Read where the service
builds its pools and ledger (``init_ledger``, :func:`~gpulab.service.jobs.pools.read_pools`),
and by the routes and managers that size slices."""

from __future__ import annotations

import os
import socket

from traitlets import Dict, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from gpulab.scheduler.policy import get_policy
from gpulab.scheduler.slices import DEFAULT_SLICE_SIZES

from ..plugins import INVENTORIES, ConfigError, NamedType
from ..setting_checks import setting_name


class InventorySettings(Configurable):
    simulate_gpus = Unicode(
        help="""Declare GPUs on a machine without any (nothing is enforced on them).

        c.InventorySettings.simulate_gpus = "2xA100-80GB"
        """,
    ).tag(config=True)

    @default("simulate_gpus")
    def _simulate_gpus(self):
        return os.environ.get("GPULAB_SIMULATE_GPUS", "")

    node_name = Unicode(
        help="""Name of this node in the inventory. Default: the host name.

        c.InventorySettings.node_name = "gpu-node-1"
        """,
    ).tag(config=True)

    @default("node_name")
    def _node_name(self):
        return socket.gethostname()

    inventory_source = Unicode(
        "local",
        help="""Where GPUs come from: "local" (NVML, or simulate_gpus) or "kubernetes"
        (the cluster's nodes: allocatable GPUs, MIG resources, HAMi's registration).
        A shortcut for inventory_class; a cluster that cannot be listed stops the start.

        c.InventorySettings.inventory_source = "kubernetes"
        """,
    ).tag(config=True)

    inventory_class = NamedType(
        INVENTORIES,
        klass="gpulab.scheduler.inventory.Inventory",
        help="""The class that lists the GPUs (a gpulab.scheduler.inventory.Inventory):
        "local", "kubernetes" or an import path. Wins over inventory_source.

        c.InventorySettings.inventory_class = "kubernetes"
        """,
    ).tag(config=True)

    pools = List(
        Dict(),
        help="""The places where this site's GPUs are, in the order jobs try them: each
        a dict with "name", "inventory" and "jobs" (local, slurm, kubernetes or an
        import path) and optionally "serving" (endpoints run in the first pool that has
        it) and "simulate" (a declared inventory). A job that names no pool runs on
        the first with room ("auto"); the ledger, quotas, usage and the dashboard see
        every pool. Empty: one pool from inventory_class, c.GpuLabService.jobs_backend_class
        and c.GpuLabService.serving_backend_class, named after the job backend.

        c.InventorySettings.pools = [
            {"name": "box", "inventory": "local", "jobs": "local", "serving": "local"},
            {"name": "slurm", "inventory": "slurm", "jobs": "slurm"},
        ]
        """,
    ).tag(config=True)

    server_pool = Unicode(
        "",
        help="""The pool users' servers take their slices in ("" = the first pool): the
        one the spawner starts servers on (the box for gpulab-local, the Slurm pool
        for gpulab-slurm).

        c.InventorySettings.server_pool = "slurm"
        """,
    ).tag(config=True)

    policy = Unicode(
        "gpulab",
        help="""Placement policy (see `gpulab.scheduler.policy.policy_names()`): gpulab's
        fragmentation-aware default, or best-fit, fgd, packing, dot-product, random.

        c.InventorySettings.policy = "best-fit"
        """,
    ).tag(config=True)

    slice_sizes = List(
        Int(),
        list(DEFAULT_SLICE_SIZES),
        help="""Slice sizes offered, in milli-GPU (250 = 1/4 GPU, 2000 = 2 GPUs).

        c.InventorySettings.slice_sizes = [0, 100, 250, 500, 1000, 2000, 4000]
        """,
    ).tag(config=True)

    @validate("policy")
    def _known_policy(self, proposal):
        try:
            get_policy(proposal.value)
        except ValueError as e:  # an unknown name; the message says which exist
            raise TraitError(f"{setting_name(proposal)}: {e}") from None
        return proposal.value

    def inventory_type(self) -> type:
        """The inventory class of a site of one pool: inventory_class where it is set,
        else the one inventory_source names."""
        if "inventory_class" in self.config[type(self).__name__]:
            return self.inventory_class
        if self.inventory_source not in INVENTORIES:
            raise ConfigError(
                f"c.InventorySettings.inventory_source = {self.inventory_source!r} is "
                f"not a source; use one of {', '.join(map(repr, INVENTORIES))} "
                f"(or set c.InventorySettings.inventory_class)"
            )
        return self.traits()["inventory_class"].validate(self, self.inventory_source)
