"""CPU, memory and device limits of one server, job rank group or replica (pure).

A slice of GPU brings its share of the host with it: ``cpu_per_gpu`` cores and
``memory_per_gpu`` bytes for each whole GPU, in proportion for a fraction, never
below a floor (a server without a GPU gets the floor). The GPU device nodes it
may open are the slice's own; every other card's node is denied.

Every group also has a ceiling on its processes and threads (``pids``): a
fork bomb stops at it with ``EAGAIN`` instead of filling the host's process
table.

``Limits`` says what to hold a process group to; ``gpulab.enforcement.cgroups``
applies it. ``None`` in a field means "not limited"; ``devices=()`` means "no
GPU device at all", which is different from ``devices=None`` ("leave devices
alone", e.g. on simulated GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
MIB = 2**20
#: What a server without a GPU gets, and the least any slice gets.
DEFAULT_CPU_FLOOR = 1.0
DEFAULT_MEMORY_FLOOR = 2 * GIB
#: Leave 1/HOST_MEMORY_RESERVE_DIVISOR of the host's memory to the hub, the service and the kernel.
HOST_MEMORY_RESERVE_DIVISOR = 10
#: Processes and threads one server, job node or replica may have at once. A torch
#: rank has some 50-150 threads (OpenMP, gloo, data loader workers); JupyterLab with
#: a few kernels a few hundred; a fork bomb stops here, far below the kernel's limit.
DEFAULT_PIDS = 4096
#: The CPU weight of one core's worth of work: cgroup v1's default ``cpu.shares``,
#: which is also the weight of one nice-0 process, or of one session where the
#: kernel groups tasks by session (autogroup: torchrun starts each rank in one).
SHARES_PER_CORE = 1024


@dataclass(frozen=True)
class Limits:
    cpu_cores: float | None  # CFS quota in cores (0.5 = half a core); None: not limited
    memory_bytes: int | None  # hard cap, swap included; None: not limited
    devices: tuple[str, ...] | None  # GPU device nodes allowed; None: not limited
    pids: int | None = None  # processes and threads at once; None: not limited

    def __post_init__(self):
        if self.cpu_cores is not None and not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be positive or None, not {self.cpu_cores!r}")
        if self.memory_bytes is not None and self.memory_bytes < MIB:
            raise ValueError(
                f"memory_bytes must be at least 1 MiB or None, not {self.memory_bytes!r}"
            )
        if self.pids is not None and self.pids < 1:
            raise ValueError(f"pids must be 1 or more or None, not {self.pids!r}")
        if self.devices is not None:
            bad = [d for d in self.devices if not d.startswith("/dev/")]
            if bad:
                raise ValueError(f"devices are device node paths under /dev, not {bad}")

    @property
    def unlimited(self) -> bool:
        return (
            self.cpu_cores is None
            and self.memory_bytes is None
            and self.devices is None
            and self.pids is None
        )


def limits_for_slice(
    gpu_milli: int,
    cpu_per_gpu: float | None,
    memory_per_gpu: int | None,
    cpu_floor: float = DEFAULT_CPU_FLOOR,
    memory_floor: int = DEFAULT_MEMORY_FLOOR,
    gpu_devices: tuple[str, ...] | list[str] | None = None,
) -> Limits:
    """The limits of a slice of ``gpu_milli`` thousandths of a GPU (0: no GPU).

    CPU and memory are proportional to the slice, never below the floors;
    ``cpu_per_gpu``/``memory_per_gpu`` of ``None`` (or 0) leave that resource
    unlimited. ``gpu_devices`` are the slice's device nodes (``/dev/nvidia0``).
    """
    if gpu_milli < 0:
        raise ValueError(f"gpu_milli must be 0 or more, not {gpu_milli}")
    cpu = None
    if cpu_per_gpu:
        cpu = max(float(cpu_floor), round(cpu_per_gpu * gpu_milli / 1000, 3))
    memory = None
    if memory_per_gpu:
        memory = max(int(memory_floor), int(memory_per_gpu) * gpu_milli // 1000)
    devices = tuple(gpu_devices) if gpu_devices is not None else None
    return Limits(cpu_cores=cpu, memory_bytes=memory, devices=devices)


def host_share_per_gpu(
    cpu_count: int, memory_bytes: int, gpu_count: int
) -> tuple[float | None, int | None]:
    """Default ``(cpu_per_gpu, memory_per_gpu)``: the host divided among its GPUs.

    A tenth of the memory is kept back for the hub, the service and the page
    cache. A host without GPUs has no per-GPU share: ``(None, None)``.
    """
    if gpu_count <= 0:
        return None, None
    usable = memory_bytes - memory_bytes // HOST_MEMORY_RESERVE_DIVISOR
    return round(cpu_count / gpu_count, 3), usable // gpu_count


def host_user_quota(cpu_count: int, memory_bytes: int) -> tuple[float, int]:
    """Default per-user quota ``(cores, bytes)``: the host's cores (CPU time is shared,
    so a user may use all of it when nobody else does) and its memory less the
    reserve kept for the hub, the service and the kernel (memory is not shared)."""
    return float(max(cpu_count, 1)), memory_bytes - memory_bytes // HOST_MEMORY_RESERVE_DIVISOR


def capped(limits: Limits, cpu_cores: float | None, memory_bytes: int | None) -> Limits:
    """``limits`` with CPU and memory no higher than ``cpu_cores`` / ``memory_bytes``
    (a quota; None or 0: no cap). An unlimited resource becomes the cap."""

    def low(value, cap):
        if not cap:
            return value
        return cap if value is None else min(value, cap)

    return Limits(
        cpu_cores=low(limits.cpu_cores, cpu_cores),
        memory_bytes=low(limits.memory_bytes, memory_bytes),
        devices=limits.devices,
        pids=limits.pids,
    )


def cpu_shares(cores: float) -> int:
    """cgroup v1 ``cpu.shares`` for a group that may use ``cores`` cores.

    In proportion to its cores (as Kubernetes does), not the default 1024 for every
    group: under contention a group weighs as one busy process whatever it holds, so
    a 2-rank job's group would get half of what 2 ranks outside any group get, and
    gpulab's whole tree (every user's work) as much as one process of the host."""
    return min(max(2, round(SHARES_PER_CORE * cores)), 262144)


def cpu_weight(cores: float) -> int:
    """cgroup v2 ``cpu.weight`` for a group that may use ``cores`` cores (100 a core,
    the default being 100 for any group, as v1's 1024)."""
    return min(max(1, round(100 * cores)), 10000)


def format_cpu(cores: float | None) -> str:
    if cores is None:
        return "CPU not limited"
    text = f"{cores:.2f}".rstrip("0").rstrip(".")
    return f"{text} CPU" if cores <= 1 else f"{text} CPUs"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "memory not limited"
    if n >= GIB:
        return f"{n / GIB:.1f}".removesuffix(".0") + " GiB"
    return f"{n / MIB:.0f} MiB"


def format_devices(devices: tuple[str, ...] | None) -> str:
    if devices is None:
        return "devices not limited"
    return "devices: " + (", ".join(devices) if devices else "no GPU")


def limits_in_words(limits: Limits) -> str:
    """``up to 2 CPUs and 8 GiB of memory; only its own GPU`` (the spawn form)."""
    held = []
    if limits.cpu_cores is not None:
        held.append(format_cpu(limits.cpu_cores))
    if limits.memory_bytes is not None:
        held.append(f"{format_bytes(limits.memory_bytes)} of memory")
    if limits.pids is not None:
        held.append(f"{limits.pids} processes")
    listed = ", ".join(held[:-1]) + f" and {held[-1]}" if len(held) > 1 else "".join(held)
    text = f"up to {listed}" if held else "CPU and memory not limited"
    if limits.devices is not None:
        text += "; only its own GPU" if limits.devices else "; no GPU device"
    return text


def format_limits(limits: Limits) -> str:
    """``2 CPUs, 8 GiB, devices: /dev/nvidia0, 4096 processes`` (for the spawn form and
    ``%gpulab``); the process cap only when there is one."""
    parts = [
        format_cpu(limits.cpu_cores),
        format_bytes(limits.memory_bytes),
        format_devices(limits.devices),
    ]
    if limits.pids is not None:
        parts.append(f"{limits.pids} processes")
    return ", ".join(parts)
