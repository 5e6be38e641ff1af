"""What GPUs a node has: read from NVML, or declared for a machine without GPUs.

A simulated inventory comes from a spec like ``2xA100-80GB`` or
``1xH200-141GB,4xT4-16GB``; every GPU it declares is marked ``simulated`` and
nothing is enforced on it. A real inventory lists each physical GPU, or each
MIG device where MIG is on (a MIG device is what a slice is placed on then).
"""

from __future__ import annotations

import contextlib
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
    #: The site's pool the GPU is in (c.GpuLabService.pools): the box, a Slurm or a
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


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_inventory(node: str | None = None) -> tuple[list[Gpu], str | None]:
    """Read GPUs from NVML. Returns ``(gpus, reason)``; reason says why none.

    MIG devices replace their parent GPU in the list: with MIG on, slices are
    placed on MIG instances, and each is addressed by its own ``MIG-`` UUID.
    """
    node = node or socket.gethostname()
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], f"no NVIDIA driver ({type(e).__name__}: {e})"
    gpus: list[Gpu] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            model = _text(pynvml.nvmlDeviceGetName(handle))
            memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            migs = _mig_devices(pynvml, handle)
            if not migs:
                gpus.append(Gpu(uuid, len(gpus), model, memory_mib, node))
            for mig_uuid, mig_mem in migs:
                gpus.append(
                    Gpu(mig_uuid, len(gpus), f"{model} MIG", mig_mem, node, mig_parent=uuid)
                )
    except pynvml.NVMLError as e:
        log.warning("NVML failed while listing GPUs: %s", e)
        return gpus, f"NVML error while listing GPUs: {e}"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return gpus, None if gpus else "the NVIDIA driver reports no GPUs"


def _mig_devices(pynvml, handle) -> list[tuple[str, int]]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return []  # NotSupported on cards without MIG
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError:
            continue  # an empty MIG slot
        found.append(
            (
                _text(pynvml.nvmlDeviceGetUUID(mig)),
                pynvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024),
            )
        )
    return found


def load_inventory(
    simulate: str | None = None, node: str | None = None
) -> tuple[list[Gpu], str | None]:
    """The node's GPUs: the simulated spec when given, else NVML."""
    if simulate:
        return parse_simulated(simulate, node), None
    return nvml_inventory(node)


class Inventory(LoggingConfigurable):
    """Where the GPUs the ledger places slices on come from (the service's
    ``c.GpuLabService.inventory_class``). ``load()`` runs once, before the service
    listens: an inventory that cannot be read raises :class:`InventoryError`, so a
    misconfigured service stops instead of serving an empty cluster.
    """

    #: This node's name (the service sets it from c.GpuLabService.node_name).
    node = Unicode()
    #: A declared inventory (c.GpuLabService.simulate_gpus); wins over any source.
    simulate = Unicode()

    def load(self) -> tuple[list[Gpu], str | None]:
        """``(gpus, reason)``: reason says why there are none (not an error)."""
        raise NotImplementedError


class LocalInventory(Inventory):
    """This machine's GPUs from NVML, or the simulated spec. The embedded default."""

    def load(self) -> tuple[list[Gpu], str | None]:
        return load_inventory(self.simulate or None, node=self.node or None)
