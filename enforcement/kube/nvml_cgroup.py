"""Driver memory limits from annotations: a shared card, a node-side enforcer.

The pod takes a shared replica of the card (time-slicing's resource) and
carries its limits as annotations; a node-side enforcer that watches the
node's pods (NVML accounting plus the container's cgroup to find its
processes) holds each container to ``gpulab.io/gpu-memory-limit-mib`` and
stops ones that exceed it. gpulab writes the annotations; the enforcer is
the cluster's (see docs/explanation/enforcement-backends.md). PyTorch's
allocator cap is set too, so well-behaved code never meets the enforcer.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, capped_env, placement, whole_gpus

NAME = "nvml-cgroup"
DEFAULTS = {
    "shared_resource": "nvidia.com/gpu.shared",
    "whole_resource": "nvidia.com/gpu",
    "annotation_prefix": "gpulab.io",
}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    if not s.fractional:
        return whole_gpus(s, options["whole_resource"])
    p = options["annotation_prefix"]
    annotations = {
        f"{p}/gpu-milli": str(s.milli),
        f"{p}/gpu-memory-limit-mib": str(s.memory_mib),
        f"{p}/gpu-core-percent": str(s.core_percent),
    }
    if s.gpu_uuids:
        annotations[f"{p}/gpu-uuid"] = ",".join(s.gpu_uuids)
    env = capped_env(s)
    return SlicePatch(
        limits={options["shared_resource"]: 1}, annotations=annotations, env=env, **placement(s)
    )
