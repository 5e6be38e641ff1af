"""Time-slicing: the card's replicas from NVIDIA's device plugin, taken in turns.

The device plugin's ``sharing.timeSlicing`` offers each card N times
(``nvidia.com/gpu.shared`` with ``renameByDefault``). The hardware isolates
nothing between the pods sharing a card; gpulab adds PyTorch's allocator cap
(``per_process_memory_fraction``), which holds code that allocates through
PyTorch and nothing else.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, placement, slice_env

NAME = "timeslice"
DEFAULTS = {"shared_resource": "nvidia.com/gpu.shared", "whole_resource": "nvidia.com/gpu"}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    if not s.fractional:
        return SlicePatch(
            limits={options["whole_resource"]: s.num_gpus}, env=slice_env(s), **placement(s)
        )
    env = slice_env(
        s, PYTORCH_CUDA_ALLOC_CONF=f"per_process_memory_fraction:{s.milli_per_gpu / 1000:.3f}"
    )
    return SlicePatch(limits={options["shared_resource"]: 1}, env=env, **placement(s))
