"""CPU, memory and device limits of one server, job rank group or replica (pure).

A slice of GPU brings its share of the host with it: ``cpu_per_gpu`` cores and
``memory_per_gpu`` bytes for each whole GPU, in proportion for a fraction, never
below a floor (a server without a GPU gets the floor). The GPU device nodes it
may open are the slice's own; every other card's node is denied.

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


@dataclass(frozen=True)
class Limits:
    cpu_cores: float | None  # CFS quota in cores (0.5 = half a core); None: not limited
    memory_bytes: int | None  # hard cap, swap included; None: not limited
    devices: tuple[str, ...] | None  # GPU device nodes allowed; None: not limited

    def __post_init__(self):
        if self.cpu_cores is not None and not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be positive or None, not {self.cpu_cores!r}")
        if self.memory_bytes is not None and self.memory_bytes < MIB:
            raise ValueError(
                f"memory_bytes must be at least 1 MiB or None, not {self.memory_bytes!r}"
            )
        if self.devices is not None:
            bad = [d for d in self.devices if not d.startswith("/dev/")]
            if bad:
                raise ValueError(f"devices are device node paths under /dev, not {bad}")

    @property
    def unlimited(self) -> bool:
        return self.cpu_cores is None and self.memory_bytes is None and self.devices is None


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


def format_limits(limits: Limits) -> str:
    """``2 CPUs, 8 GiB, devices: /dev/nvidia0`` (for the spawn form and ``%gpulab``)."""
    return ", ".join(
        (
            format_cpu(limits.cpu_cores),
            format_bytes(limits.memory_bytes),
            format_devices(limits.devices),
        )
    )
