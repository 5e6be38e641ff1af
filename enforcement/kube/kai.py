"""KAI Scheduler: GPU fractions placed by NVIDIA's KAI scheduler.

A fraction is the pod annotation ``gpu-fraction`` (no ``nvidia.com/gpu``
request); KAI packs fractions onto cards and accounts them against the
pod's queue (label ``kai.scheduler/queue``). KAI schedules shares; it does not
cap memory or compute inside the card, so gpulab adds PyTorch's allocator
cap. Whole cards are plain ``nvidia.com/gpu`` requests under KAI.
"""

from __future__ import annotations

from .base import GpuSlice, SlicePatch, capped_env, placement, whole_gpus

NAME = "kai"
DEFAULTS = {
    "scheduler_name": "kai-scheduler",
    "queue": "default",
    "queue_label": "kai.scheduler/queue",
}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    labels = {options["queue_label"]: options["queue"]} if options["queue"] else {}
    common = dict(labels=labels, scheduler_name=options["scheduler_name"])
    if not s.fractional:
        return whole_gpus(s, **common)
    env = capped_env(s)
    return SlicePatch(
        annotations={"gpu-fraction": f"{s.milli_per_gpu / 1000:g}"},
        env=env,
        **common,
        **placement(s),
    )
