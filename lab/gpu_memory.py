"""GPU memory in use by this server and its kernels, when NVML can tell.

Counted per process (NVML's compute processes on the slice's GPUs whose pid is this
server or one of its descendants), so a neighbour's use on a shared card is not
counted. Without an NVIDIA driver, or on a simulated GPU, it says why not.
"""

from __future__ import annotations

import contextlib
import os


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def used_mib(uuids: list[str], simulated: bool) -> tuple[float | None, str]:
    """(MiB in use by this server's processes, a note); None when not measurable."""
    if simulated:
        return None, "simulated GPU: no memory to measure"
    if not uuids:
        return None, "no GPU"
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no library, no driver: NVML raises its own errors
        return None, f"not measurable: no NVIDIA driver here ({type(e).__name__})"
    try:
        mine = descendants(os.getpid())
        total = 0
        for uuid in uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid in mine and p.usedGpuMemory:
                    total += p.usedGpuMemory
        return total / 2**20, "NVML: memory of this server's processes"
    except Exception as e:
        return None, f"not measurable: NVML said {e}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
