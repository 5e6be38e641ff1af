"""HAMi: a share of a card's memory and SMs, enforced inside the container.

HAMi's device plugin hands the pod a virtual GPU; HAMi-core (an intercepting
CUDA library its webhook injects) caps device memory at ``nvidia.com/gpumem``
MiB and compute at ``nvidia.com/gpucores`` percent. Its scheduler extender
places the pod; ``nvidia.com/use-gpuuuid`` pins it to the card the ledger
chose when HAMi reported that card's UUID.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, placement, slice_env

NAME = "hami"
DEFAULTS = {"scheduler_name": "hami-scheduler", "resource_prefix": "nvidia.com"}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    prefix = options["resource_prefix"]
    limits: dict[str, int] = {f"{prefix}/gpu": s.num_gpus}
    if s.fractional:
        limits[f"{prefix}/gpumem"] = s.memory_mib
        limits[f"{prefix}/gpucores"] = s.core_percent
    else:
        limits[f"{prefix}/gpucores"] = 100  # a whole card is not shared with anyone
    annotations = {}
    real = [u for u in s.gpu_uuids if u.startswith("GPU-")]
    if real and len(real) == s.num_gpus:
        annotations["nvidia.com/use-gpuuuid"] = ",".join(real)
    return SlicePatch(
        limits=limits,
        annotations=annotations,
        env=slice_env(s),
        scheduler_name=options["scheduler_name"] or None,
        **placement(s),
    )
