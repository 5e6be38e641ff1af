"""The banner's GPU line of ``gpulab up``: what the service will find on this machine.

Without ``--simulate-gpus`` the service reads the GPUs from the NVIDIA driver (NVML).
Where there is no driver it finds none and the spawn form strikes every size: the
banner says so, and how to try the platform anyway, rather than "from the NVIDIA
driver" over an empty inventory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

SIMULATE_HINT = "--simulate-gpus SPEC (e.g. --simulate-gpus 2xA100-80GB)"


def driver_gpus() -> tuple[int, str]:
    """``(count, why none)``: how many GPUs the NVIDIA driver reports here."""
    try:
        import pynvml
    except ImportError:
        return 0, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return 0, "no NVIDIA driver found"
    except pynvml.NVMLError_DriverNotLoaded:
        return 0, "the NVIDIA driver is not loaded"
    except pynvml.NVMLError as e:
        return 0, f"NVML does not start: {e}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:
        return 0, f"NVML cannot count the GPUs: {e}"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return count, "" if count else "the NVIDIA driver reports none"


def gpus_line(simulate: str, probe: Callable[[], tuple[int, str]] = driver_gpus) -> str:
    """What follows ``GPUs:`` in the banner (a second line, indented, where there are none)."""
    if simulate:
        return f"simulated {simulate} (declared by --simulate-gpus: nothing is enforced on them)"
    count, why = probe()
    if count:
        return f"{count} from the NVIDIA driver"
    return (
        f"none on this machine ({why}): every size on the spawn form is unavailable.\n"
        f"    To try gpulab without GPUs, start it with {SIMULATE_HINT}"
    )
