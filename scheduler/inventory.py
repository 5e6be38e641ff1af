"""What the ledger knows of a GPU (:class:`Gpu`), the interface of the inventories
that list them (:class:`Inventory`), and GPUs declared for a machine without any.

A simulated inventory comes from a spec like ``2xA100-80GB`` or
``1xH200-141GB,4xT4-16GB``; every GPU it declares is marked ``simulated`` and
nothing is enforced on it. The inventories themselves (this machine's NVML, a
Kubernetes cluster's nodes, a Slurm cluster's GRES) read the world, so they live in
``backend/``: :mod:`gpulab.backend.local_inventory`,
:mod:`gpulab.backend.kubernetes.inventory`, :mod:`gpulab.backend.slurm_inventory`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import socket
from dataclasses import asdict, dataclass

from traitlets import Unicode
from traitlets.config import LoggingConfigurable

log = logging.getLogger(__name__)


class InventoryError(ValueError):
    """A GPU spec that cannot be parsed."""


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    node: str
    simulated: bool = False
    mig_parent: str | None = None  # the physical GPU's UUID for a MIG device
    #: The site's pool the GPU is in (c.InventorySettings.pools): the box, a Slurm or a
    #: Kubernetes cluster. A job runs where its slices are, so a pool's GPUs only
    #: take work of the pool's own backend.
    pool: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_SPEC_ITEM = re.compile(r"^\s*(\d+)\s*x\s*([A-Za-z0-9_.]+?)(?:-(\d+)\s*GB)?\s*$", re.IGNORECASE)


def parse_simulated(spec: str, node: str | None = None) -> list[Gpu]:
    """Parse ``2xA100-80GB,1xT4-16GB`` into simulated GPUs with stable UUIDs.

    UUIDs derive from node, position and model, so a restart with the same
    spec finds the same GPUs (and the ledger's allocations still point at them).
    """
    node = node or socket.gethostname()
    gpus: list[Gpu] = []
    for item in spec.split(","):
        m = _SPEC_ITEM.match(item)
        if not m:
            raise InventoryError(
                f"cannot read GPU spec {item.strip()!r} in {spec!r}; "
                f"write COUNTxMODEL-MEMGB, e.g. 2xA100-80GB or 1xH200-141GB,4xT4-16GB"
            )
        count, model, mem_gb = int(m.group(1)), m.group(2), m.group(3)
        if count < 1:
            raise InventoryError(
                f"GPU count must be at least 1 in {item.strip()!r}; "
                f"write COUNTxMODEL-MEMGB, e.g. 2xA100-80GB"
            )
        memory_mib = int(mem_gb) * 1024 if mem_gb else 16 * 1024
        for _ in range(count):
            index = len(gpus)
            digest = hashlib.sha1(f"{node}/{index}/{model}".encode()).hexdigest()
            uuid = (
                f"GPU-sim{digest[:5]}-{digest[5:9]}-{digest[9:13]}-{digest[13:17]}-{digest[17:29]}"
            )
            gpus.append(
                Gpu(
                    uuid,
                    index,
                    f"{model}-{mem_gb}GB" if mem_gb else model,
                    memory_mib,
                    node,
                    simulated=True,
                )
            )
    return gpus


class Inventory(LoggingConfigurable):
    """Where the GPUs the ledger places slices on come from (the service's
    ``c.InventorySettings.inventory_class``). ``load()`` runs once, before the service
    listens: an inventory that cannot be read raises :class:`InventoryError`, so a
    misconfigured service stops instead of serving an empty cluster.
    """

    #: This node's name (the service sets it from c.InventorySettings.node_name).
    node = Unicode()
    #: A declared inventory (c.InventorySettings.simulate_gpus); wins over any source.
    simulate = Unicode()

    def load(self) -> tuple[list[Gpu], str | None]:
        """``(gpus, reason)``: reason says why there are none (not an error)."""
        raise NotImplementedError
