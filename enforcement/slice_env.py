"""Holding a local process to its slice: environment variables, best first.

On one machine (no Kubernetes), three mechanisms stack:

1. ``CUDA_VISIBLE_DEVICES`` by UUID: the process sees only its GPU(s), or its
   MIG device, which the hardware isolates fully.
2. ``PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F``: PyTorch's caching
   allocator refuses to grow past F of the card's memory (cooperative: code
   that bypasses PyTorch's allocator is not held).
3. With an MPS control daemon running: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
   caps the SMs the process may use and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
   caps its device memory in the driver.

CUDA looks for that daemon in ``/tmp/nvidia-mps`` unless told otherwise, a folder any
account can make first: a daemon a user starts there would take every other user's
CUDA processes as clients (queued behind its own server, or served by it). So only a
daemon of root's (or of the service's account) is used, and without one every local
process on a real GPU is pointed at a folder in root's ``/run`` that nobody makes.

Whatever the user or the hub's own environment set for these is removed
first, so a slice cannot be widened from the outside.
"""

from __future__ import annotations

import os
import stat

#: Variables that widen or bypass a slice; never passed through from outside.
STRIPPED_PREFIXES = ("CUDA_MPS_",)
STRIPPED_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DISABLE_CONTROL",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH_PRELOAD",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "GPU_DEVICE_ORDINAL",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
)
GPULAB_PREFIX = "GPULAB_GPU_"


def strip_enforcement_vars(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without anything that could widen a slice."""
    return {
        k: v
        for k, v in env.items()
        if k not in STRIPPED_NAMES
        and not k.startswith(STRIPPED_PREFIXES)
        and not k.startswith(GPULAB_PREFIX)
    }


#: Where CUDA looks for the MPS control daemon by default.
DEFAULT_MPS_DIR = "/tmp/nvidia-mps"
#: Where local processes look when the host has no daemon gpulab trusts: only root
#: can make anything in /run, and nothing makes this.
NO_MPS_DIR = "/run/gpulab/no-mps-daemon"


def mps_pipe_directory(env: dict[str, str] | None = None) -> str | None:
    """The MPS pipe directory if a control daemon gpulab trusts listens there: the
    folder (not a link) and its control pipe are root's or this service's account's."""
    env = env if env is not None else dict(os.environ)
    path = env.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_MPS_DIR)
    trusted = {0, os.geteuid()}
    try:
        folder = os.lstat(path)
        control = os.lstat(os.path.join(path, "control"))
    except OSError:
        return None
    pipe = stat.S_ISFIFO(control.st_mode) or stat.S_ISSOCK(control.st_mode)
    if stat.S_ISDIR(folder.st_mode) and pipe and {folder.st_uid, control.st_uid} <= trusted:
        return path
    return None


def mps_client_env(mps_dir: str | None) -> dict[str, str]:
    """Which daemon a local process on a real GPU may reach: ``mps_dir``, else none."""
    return {"CUDA_MPS_PIPE_DIRECTORY": mps_dir or NO_MPS_DIR}


def slice_env(allocations: list[dict], simulated: bool, mps_dir: str | None) -> dict[str, str]:
    """Environment that states and enforces the slice held in ``allocations``.

    ``allocations`` are the ledger rows of one owner (one per GPU touched).
    An empty list means no GPU: CUDA sees none.
    """
    if not allocations:
        return {"GPULAB_GPU_MILLI": "0", "GPULAB_GPU_UUID": "", "CUDA_VISIBLE_DEVICES": ""}
    uuids = [a["gpu_uuid"] for a in allocations]
    milli = sum(a["milli"] for a in allocations)
    per_gpu = allocations[0]["milli"]
    env = {
        "GPULAB_GPU_MILLI": str(milli),
        "GPULAB_GPU_UUID": ",".join(uuids),
        "GPULAB_GPU_MEMORY_MIB": str(sum(a["memory_mib"] for a in allocations)),
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if simulated:
        # A declared GPU: say so, and enforce nothing on the real machine.
        env["GPULAB_GPU_SIMULATED"] = "1"
        env["GPULAB_GPU_ENFORCEMENT"] = "none: a simulated GPU"
        return env
    env["GPULAB_GPU_ENFORCEMENT"] = enforcement_text(uuids, per_gpu, mps_dir)
    env.update(mps_client_env(mps_dir))
    if per_gpu < 1000:
        env["PYTORCH_CUDA_ALLOC_CONF"] = f"per_process_memory_fraction:{per_gpu / 1000:.3f}"
        if mps_dir:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, per_gpu // 10))
            # Device 0 is the slice's GPU once CUDA_VISIBLE_DEVICES narrowed the view.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={allocations[0]['memory_mib']}M"
    return env


def enforcement_text(uuids: list[str], per_gpu: int, mps_dir: str | None) -> str:
    """Which mechanism holds the slice, and how strongly (spawn form, ``%gpulab``)."""
    if all(u.startswith("MIG-") for u in uuids):
        return "MIG: memory and compute held by the hardware"
    if per_gpu >= 1000:
        return "whole card: CUDA_VISIBLE_DEVICES and the device cgroup"
    if mps_dir:
        # The limits travel in the client's environment, which the user's code can
        # change before CUDA starts: advice-strength unless the operator also sets
        # the daemon's defaults (set_default_device_pinned_mem_limit).
        return (
            "MPS: memory and SM share set in the client's environment (code can "
            "raise them unless the daemon's defaults are set); "
            "CUDA_VISIBLE_DEVICES and the device cgroup hold the card"
        )
    return (
        "PyTorch allocator limit: advice only (code can lift it); "
        "CUDA_VISIBLE_DEVICES and the device cgroup hold the card"
    )
