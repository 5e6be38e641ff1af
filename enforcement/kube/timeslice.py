"""Time-slicing: the card's replicas from NVIDIA's device plugin, taken in turns.

The device plugin's ``sharing.timeSlicing`` offers each card N times
(``nvidia.com/gpu.shared`` with ``renameByDefault``). The hardware isolates
nothing between the pods sharing a card; gpulab adds PyTorch's allocator cap
(``per_process_memory_fraction``), which holds code that allocates through
PyTorch and nothing else.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, capped_env, placement, whole_gpus

NAME = "timeslice"
DEFAULTS = {"shared_resource": "nvidia.com/gpu.shared", "whole_resource": "nvidia.com/gpu"}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    if not s.fractional:
        return whole_gpus(s, options["whole_resource"])
    env = capped_env(s)
    return SlicePatch(limits={options["shared_resource"]: 1}, env=env, **placement(s))
