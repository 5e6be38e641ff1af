"""A stand-in for NVML: the one part of telemetry that cannot run without a GPU.

It answers NVML's functions for a declared set of boards and raises pynvml's
real error classes, so the sampler's error handling is exercised as it would
be against a driver. Constants and error classes come from pynvml itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml picks the subclass for the code


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class FakeDevice:
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    gpu_util: int | None = 0  # percent; None = NotSupported
    mem_util: int | None = 0
    temperature: int | None = 40
    power_mw: int | None = 100_000
    energy_mj: int | None = 1_000_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig: dict[int, FakeDevice] | None = None  # slot -> device; None = MIG off
    mig_slots: int = 7
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


def _supported(value):
    if value is None:
        raise nvml_error(NOT_SUPPORTED)
    return value


class FakeNvml:
    def __init__(self, devices: list[FakeDevice], init_error: int | None = None):
        self.devices = devices
        self.init_error = init_error
        self.count_error: int | None = None
        self.started = 0
        self.shutdowns = 0

    def __getattr__(self, name):
        if name.startswith("NVML"):  # constants and error classes
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml has no {name}; add it when the sampler needs it")

    def nvmlInit(self):
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.started += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        if self.count_error is not None:
            raise nvml_error(self.count_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUUID(self, d):
        return d.uuid

    def nvmlDeviceGetName(self, d):
        return d.name

    def nvmlDeviceGetUtilizationRates(self, d):
        return SimpleNamespace(gpu=_supported(d.gpu_util), memory=_supported(d.mem_util))

    def nvmlDeviceGetMemoryInfo(self, d):
        return SimpleNamespace(
            total=d.memory_total, used=d.memory_used, free=d.memory_total - d.memory_used
        )

    def nvmlDeviceGetTemperature(self, d, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return _supported(d.temperature)

    def nvmlDeviceGetPowerUsage(self, d):
        return _supported(d.power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, d):
        return _supported(d.energy_mj)

    def nvmlDeviceGetMigMode(self, d):
        if d.gpu_instance_id is not None:  # a MIG device has no MIG mode itself
            raise nvml_error(NOT_SUPPORTED)
        enabled = d.mig is not None
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, d):
        return d.mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, d, slot):
        if slot not in d.mig:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return d.mig[slot]

    def nvmlDeviceGetGpuInstanceId(self, d):
        return d.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, d):
        return d.compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, d):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in d.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, d):
        raise nvml_error(NOT_SUPPORTED)  # a datacenter board without graphics


def a100_mig_3g20gb(processes: list[tuple[int, int | None]]) -> FakeDevice:
    """A 3g.20gb MIG device of an A100-40GB, 4 GiB used: as NVML reports one, with
    no utilisation, temperature or power of its own."""
    return FakeDevice(
        "MIG-1111",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        20 * 2**30,
        4 * 2**30,
        gpu_util=None,
        mem_util=None,
        temperature=None,
        power_mw=None,
        energy_mj=None,
        processes=processes,
        gpu_instance_id=1,
        compute_instance_id=0,
    )
