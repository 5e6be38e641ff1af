"""This machine's GPUs, read from NVML (or declared: ``simulate_gpus``).

A real inventory lists each physical GPU, or each MIG device where MIG is on (a
MIG device is what a slice is placed on then).
"""

from __future__ import annotations

import contextlib
import logging
import socket

from gpulab.scheduler.inventory import Gpu, Inventory, parse_simulated

log = logging.getLogger(__name__)


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


class LocalInventory(Inventory):
    """This machine's GPUs from NVML, or the simulated spec. The embedded default."""

    def load(self) -> tuple[list[Gpu], str | None]:
        return load_inventory(self.simulate or None, node=self.node or None)
