"""Memory honesty: an out-of-memory rank says what it tried to hold against its cap.

The cap is what the slice gives a rank: on a GPU its share of the card
(``set_per_process_memory_fraction``, from ``--gpu``), on CPU the memory limit
of the node's cgroup (the slice's share of the host). One line, for the job's
failure summary, with what to change.
"""

from __future__ import annotations

import os
import resource

FIXES = (
    "shard the model with ctx.wrap(model, shard=True) (or --fsdp) over more ranks, "
    "ask for a bigger slice (--gpu), or train a LoRA adapter instead of every weight"
)
#: cgroup v1 says "no limit" with a huge number.
UNLIMITED = 1 << 60


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch
    except ImportError:
        return False
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def cgroup_memory(pid: int | str = "self") -> tuple[int | None, int | None]:
    """(limit, peak usage) in bytes of the memory cgroup ``pid`` is in; None where
    there is no limit or no such file (v1 and v2)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            return _read(base, "memory.limit_in_bytes"), _read(base, "memory.max_usage_in_bytes")
        if controllers == "":
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            return _read(base, "memory.max"), _read(base, "memory.peak")
    return None, None


def _read(folder: str, name: str) -> int | None:
    try:
        with open(os.path.join(folder, name)) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)


def explain(exc: BaseException, rank: int) -> str:
    """``rank 1 ran out of memory: it held 1.93 GiB of its slice's cap of 2.00 GiB ...``."""
    held, cap, where = None, None, "memory"
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            held = torch.cuda.max_memory_reserved(device)
            total = torch.cuda.get_device_properties(device).total_memory
            milli = int(os.environ.get("GPULAB_GPU_MILLI") or 1000)
            cap = total * min(milli, 1000) // 1000
            where = "GPU memory"
    except Exception:  # noqa: BLE001 - the explanation must never hide the error
        pass
    if cap is None:
        cap, peak = cgroup_memory()
        # ru_maxrss: this process's peak, in KiB on Linux; the cgroup's peak covers the node.
        held = peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tried = f"it held up to {gib(held)}" if held else "it ran out"
    against = f" against the slice's cap of {gib(cap)} of {where}" if cap else f" of {where}"
    return f"rank {rank} ran out of memory: {tried}{against}; {FIXES}"
