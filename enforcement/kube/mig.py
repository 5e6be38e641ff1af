"""MIG (mixed strategy): the slice snapped to a hardware partition of the card.

NVIDIA's device plugin with ``migStrategy: mixed`` offers each profile as its
own resource (``nvidia.com/mig-2g.20gb``). The hardware isolates memory,
cache, SMs and faults. A fraction is snapped up to the card's smallest
profile that holds it (:mod:`.mig_profiles`); whole cards are asked for as
``nvidia.com/gpu`` (cards without MIG) unless ``whole_as_mig`` asks for the
full-card profile (``7g.80gb``) instead.
"""

from __future__ import annotations

from .base import EnforcementError, GpuSlice, SlicePatch, placement, slice_env
from .mig_profiles import MIG_PROFILES, card_key, profiles_of, snap

NAME = "mig"
DEFAULTS = {"profiles": None, "whole_as_mig": False}


def patch(s: GpuSlice, options: dict) -> SlicePatch:
    table = {**MIG_PROFILES, **(options["profiles"] or {})}
    if not s.gpu_model:
        raise EnforcementError("the mig backend needs the GPU's model to choose a MIG profile")
    if s.fractional:
        profile = snap(s.milli, s.gpu_model, s.card_memory_mib, table)
        limits = {profile.resource: 1}
        memory_mib = profile.memory_gb * 1024
    elif options["whole_as_mig"]:
        key = card_key(s.gpu_model, s.card_memory_mib, table)
        profile = max(profiles_of(table[key]), key=lambda p: p.memory_eighths)
        limits = {profile.resource: s.num_gpus}
        memory_mib = profile.memory_gb * 1024 * s.num_gpus
    else:
        return SlicePatch(limits={"nvidia.com/gpu": s.num_gpus}, env=slice_env(s), **placement(s))
    env = slice_env(s, GPULAB_GPU_MEMORY_MIB=str(memory_mib), GPULAB_MIG_PROFILE=profile.name)
    return SlicePatch(limits=limits, env=env, **placement(s))
