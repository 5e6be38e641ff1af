"""Memory honesty: an out-of-memory rank says what it tried to hold against its cap.

The cap is what the slice gives a rank: on a GPU its share of the card
(``set_per_process_memory_fraction``, from ``--gpu``), on CPU the memory limit
of the node's cgroup (the slice's share of the host). One line, for the job's
failure summary, with what to change.
"""

from __future__ import annotations

import os
import resource

from .env import NODE_MEMORY_BYTES

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


def cpu_cap() -> tuple[int | None, str]:
    """This rank's memory cap on CPU (bytes, or None) and how it is held: its share
    of its node's group (which the backend says; the group itself is not readable
    to the rank), else its own cgroup's limit where it can read it."""
    node = int(os.environ.get(NODE_MEMORY_BYTES) or 0)
    if node:
        ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE") or 1), 1)
        if ranks == 1:
            return node, "the slice's cap"
        return node // ranks, f"its share of the slice's cap ({gib(node)} for {ranks} ranks)"
    limit, _ = cgroup_memory()
    return limit, "the memory limit of its cgroup"


def explain(exc: BaseException, rank: int) -> str:
    """``rank 1 ran out of memory: it held up to 1.93 GiB against the slice's cap of ...``."""
    held, cap, against = None, None, ""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            held = torch.cuda.max_memory_reserved(device)
            total = torch.cuda.get_device_properties(device).total_memory
            milli = min(int(os.environ.get("GPULAB_GPU_MILLI") or 1000), 1000)
            cap = total * milli // 1000
            against = f"the slice's {milli / 1000:g} of its GPU"
    except Exception:  # noqa: BLE001 - the explanation must never hide the error
        pass
    if cap is None:
        cap, against = cpu_cap()
        held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    text = f"rank {rank} ran out of memory: it held up to {gib(held)}"
    if cap:
        text += f" against {against}, {gib(cap)}"
    return f"{text}; {FIXES}"


def killed_line(rank: int | None, node: int, node_cap: int | None, ranks: int) -> str:
    """The job's summary when the kernel's OOM killer stopped a rank (SIGKILL: the rank
    had no chance to say it), from its node group's count of OOM kills."""
    who = f"rank {rank}" if rank is not None else f"a rank of node {node}"
    text = f"{who} was killed for memory: node {node}'s ranks needed more than"
    if node_cap:
        share = f", {gib(node_cap // ranks)} a rank" if ranks > 1 else ""
        text += f" the slice's cap of {gib(node_cap)}{share}"
    else:
        text += " the slice's memory"
    return f"{text}; {FIXES}"
