"""MPS: one CUDA context per card shared through NVIDIA's MPS server.

NVIDIA's device plugin with ``sharing.mps`` runs an MPS control daemon per
card and offers replicas of it (renamed to ``nvidia.com/gpu.shared`` with
``renameByDefault``). The pod's client limits narrow its share further:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the SMs it may use and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` caps its device memory in the driver.
Faults are not isolated: a fatal error in one client ends every client on
the card. Whole cards are asked for as plain ``nvidia.com/gpu``.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, placement, slice_env, whole_gpus

NAME = "mps"
DEFAULTS = {"shared_resource": "nvidia.com/gpu.shared", "whole_resource": "nvidia.com/gpu"}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    if not s.fractional:
        return whole_gpus(s, options["whole_resource"])
    env = slice_env(
        s,
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(s.core_percent),
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={s.memory_mib}M",
    )
    return SlicePatch(limits={options["shared_resource"]: 1}, env=env, **placement(s))
