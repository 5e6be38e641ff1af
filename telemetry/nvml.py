"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call can fail on its own: a driver too old for a function, a
query a board does not support (power on some SKUs, utilisation of a MIG
device), a GPU that fell off the bus. Each field is read separately; a failed
one is ``None`` with the error's class name under the GPU's ``errors``, and
the rest of the sample stands. When NVML cannot start at all the sampler
raises ``SourceMissing`` with the reason (no driver on a CPU node).

One GPU in a sample::

    {"index": 0, "uuid": "GPU-…", "name": "NVIDIA H200",
     "utilization_ratio": 0.93, "memory_utilization_ratio": 0.41,
     "memory_used_bytes": …, "memory_total_bytes": …,
     "temperature_celsius": 61, "power_watts": 402.5, "energy_joules": 123456.7,
     "mig_enabled": false,
     "mig": [{"index": 0, "uuid": "MIG-…", "profile": "1g.18gb",
              "gpu_instance_id": 7, "compute_instance_id": 0,
              "memory_used_bytes": …, "memory_total_bytes": …,
              "utilization_ratio": null, "processes": [...], "errors": {…}}],
     "processes": [{"pid": 4242, "user": "alice", "unix_user": "jovyan",
                    "memory_used_bytes": …}],
     "errors": {"power_watts": "NVMLError_NotSupported"}}
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from .procs import jupyterhub_user, unix_user
from .sample import SourceMissing


def _load_pynvml():
    try:
        import pynvml
    except ImportError:
        raise SourceMissing("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    return pynvml


def describe_start_failure(nvml, err: Exception) -> str:
    name = type(err).__name__
    if isinstance(err, nvml.NVMLError_LibraryNotFound):
        return f"no NVIDIA driver: NVML library not found ({name})"
    if isinstance(err, nvml.NVMLError_DriverNotLoaded):
        return f"NVIDIA driver not loaded ({name})"
    if isinstance(err, nvml.NVMLError_NoPermission):
        return f"no permission to use NVML ({name})"
    return f"NVML failed to start ({name}: {err})"


class NvmlSampler:
    """Samples every GPU (and MIG device) NVML sees; keeps NVML initialised.

    ``nvml`` is the pynvml module (or a stand-in with the same functions);
    ``proc`` is where processes are looked up for their JupyterHub user.
    """

    def __init__(self, nvml: Any = None, proc: str = "/proc"):
        self._nvml = nvml
        self.proc = proc
        self._started = False

    def sample(self) -> list[dict]:
        nvml = self._nvml = self._nvml or _load_pynvml()
        if not self._started:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as err:
                raise SourceMissing(describe_start_failure(nvml, err)) from None
            self._started = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            # Start afresh next time: the driver may have been reloaded.
            self.close()
            raise SourceMissing(f"NVML cannot count GPUs ({type(err).__name__}: {err})") from None
        return [self._gpu(i) for i in range(count)]

    def close(self) -> None:
        if self._started:
            self._started = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # -- one device ----------------------------------------------------------

    def _call(self, errors: dict, field: str, fn: Callable, *args):
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            errors[field] = type(err).__name__
            return None

    def _gpu(self, index: int) -> dict:
        nvml, errors = self._nvml, {}
        gpu: dict[str, Any] = {"index": index, "errors": errors}
        handle = self._call(errors, "handle", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return gpu
        gpu["uuid"] = self._call(errors, "uuid", nvml.nvmlDeviceGetUUID, handle)
        gpu["name"] = self._call(errors, "name", nvml.nvmlDeviceGetName, handle)
        gpu.update(self._usage(handle, errors))
        temperature = self._call(
            errors,
            "temperature_celsius",
            nvml.nvmlDeviceGetTemperature,
            handle,
            nvml.NVML_TEMPERATURE_GPU,
        )
        power_mw = self._call(errors, "power_watts", nvml.nvmlDeviceGetPowerUsage, handle)
        energy_mj = self._call(
            errors, "energy_joules", nvml.nvmlDeviceGetTotalEnergyConsumption, handle
        )
        gpu["temperature_celsius"] = temperature
        gpu["power_watts"] = power_mw / 1000 if power_mw is not None else None
        gpu["energy_joules"] = energy_mj / 1000 if energy_mj is not None else None
        mode = self._call(errors, "mig_enabled", nvml.nvmlDeviceGetMigMode, handle)
        gpu["mig_enabled"] = bool(mode[0] == nvml.NVML_DEVICE_MIG_ENABLE) if mode else None
        gpu["mig"] = self._mig_devices(handle) if gpu["mig_enabled"] else []
        gpu["processes"] = self._processes(handle, errors)
        return gpu

    def _usage(self, handle, errors: dict) -> dict:
        nvml = self._nvml
        rates = self._call(errors, "utilization_ratio", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(errors, "memory_used_bytes", nvml.nvmlDeviceGetMemoryInfo, handle)
        return {
            "utilization_ratio": rates.gpu / 100 if rates is not None else None,
            "memory_utilization_ratio": rates.memory / 100 if rates is not None else None,
            "memory_used_bytes": memory.used if memory is not None else None,
            "memory_total_bytes": memory.total if memory is not None else None,
        }

    def _mig_devices(self, parent) -> list[dict]:
        nvml, devices = self._nvml, []
        slots = self._call({}, "mig", nvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 0
        for slot in range(slots):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except nvml.NVMLError:
                continue  # an empty slot answers NotFound
            errors: dict = {}
            name = self._call(errors, "profile", nvml.nvmlDeviceGetName, handle)
            profile = re.search(r"MIG (\S+)", name or "")
            devices.append(
                {
                    "index": slot,
                    "uuid": self._call(errors, "uuid", nvml.nvmlDeviceGetUUID, handle),
                    "profile": profile.group(1) if profile else None,
                    "gpu_instance_id": self._call(
                        errors, "gpu_instance_id", nvml.nvmlDeviceGetGpuInstanceId, handle
                    ),
                    "compute_instance_id": self._call(
                        errors, "compute_instance_id", nvml.nvmlDeviceGetComputeInstanceId, handle
                    ),
                    **self._usage(handle, errors),
                    "processes": self._processes(handle, errors),
                    "errors": errors,
                }
            )
        return devices

    def _processes(self, handle, errors: dict) -> list[dict]:
        nvml, used = self._nvml, {}
        for query in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for p in self._call(errors, "processes", query, handle) or []:
                # A process doing compute and graphics is listed twice with one
                # figure; None means the driver would not say (no privilege).
                if p.usedGpuMemory is not None:
                    used[p.pid] = max(p.usedGpuMemory, used.get(p.pid) or 0)
                else:
                    used.setdefault(p.pid, None)
        return [
            {
                "pid": pid,
                "user": jupyterhub_user(pid, self.proc),
                "unix_user": unix_user(pid, self.proc),
                "memory_used_bytes": memory,
            }
            for pid, memory in sorted(used.items())
        ]
