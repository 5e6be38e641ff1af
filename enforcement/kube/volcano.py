"""Volcano vGPU: Volcano's scheduler with its vGPU device plugin (HAMi-core inside).

``volcano.sh/vgpu-number`` cards, each capped at ``volcano.sh/vgpu-memory`` MiB
and ``volcano.sh/vgpu-cores`` percent by the in-container limiter; Volcano
places the pod and charges its queue (annotation
``scheduling.volcano.sh/queue-name``).
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, placement, slice_env

NAME = "volcano"
DEFAULTS = {"scheduler_name": "volcano", "queue": ""}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    limits: dict[str, int] = {"volcano.sh/vgpu-number": s.num_gpus}
    if s.fractional:
        limits["volcano.sh/vgpu-memory"] = s.memory_mib
        limits["volcano.sh/vgpu-cores"] = s.core_percent
    else:
        limits["volcano.sh/vgpu-cores"] = 100
    annotations = {"scheduling.volcano.sh/queue-name": options["queue"]} if options["queue"] else {}
    return SlicePatch(
        limits=limits,
        annotations=annotations,
        env=slice_env(s),
        scheduler_name=options["scheduler_name"],
        **placement(s),
    )
