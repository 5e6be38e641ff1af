"""A stand-in for the NVIDIA driver's NVML, which this machine does not have.

A module with the functions of ``pynvml`` that gpulab's sampler calls, built on
pynvml's real classes and constants: its errors are ``pynvml.NVMLError_GpuIsLost``,
``pynvml.NVMLError_Timeout``... (``pynvml.NVMLError(code)`` picks the class), its
events are ``pynvml.c_nvmlEventData_t``, its memory and utilisation answers are
``pynvml.c_nvmlMemory_t`` and ``pynvml.c_nvmlUtilization_t``, and its device
handles are ``pynvml.c_nvmlDevice_t`` pointers (never dereferenced).

Its GPUs live in a JSON file (``$GPULAB_FAKE_NVML``) that it rereads on every
call, so a test tells it what to raise from another process too::

    driver = FakeDriver(tmp_path / "nvml.json")
    driver.add_gpu("GPU-1234...", "NVIDIA A100-80GB")
    monkeypatch.setenv(*driver.env())            # or pass driver.env() to a process
    # the service's sampler, with GPULAB_NVML_MODULE=support.fake_nvml, reads it
    driver.raise_xid("GPU-1234...", 79)          # an XID event, as the driver sends
    driver.count_ecc("GPU-1234...", 2)           # two more uncorrectable ECC errors
    driver.lose("GPU-1234...")                   # every call for it: GpuIsLost

Events are delivered as NVML does: to an event set a GPU is registered with,
only those raised after its registration, each once (``nvmlEventSetWait_v2``
answers ``NVMLError_Timeout`` when none is left).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

import pynvml
from pynvml import (
    NVML_DEVICE_MIG_DISABLE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
    c_nvmlDevice_t,
    c_nvmlEventData_t,
    c_nvmlMemory_t,
    c_nvmlUtilization_t,
    nvmlEventTypeXidCriticalError,
)

# pynvml's constants and error classes (NVML_*, NVMLError_*, nvmlEventType*), as it
# has them; its functions are not copied: what the stand-in does not answer is absent.
globals().update({k: v for k, v in vars(pynvml).items() if k.startswith(("NVML", "nvmlEventType"))})

#: The JSON file with the GPUs (see :class:`FakeDriver`).
STATE_ENV = "GPULAB_FAKE_NVML"
#: What the sampler imports instead of pynvml (``GPULAB_NVML_MODULE``).
MODULE = "support.fake_nvml"
#: Handles are fake addresses: BASE + index.
_BASE = 0x6770_0000

_lock = threading.Lock()
_started = 0


class _EventSet:
    """What nvmlEventSetCreate hands out: GPUs registered, events delivered."""

    def __init__(self) -> None:
        self.delivered: dict[str, int] = {}  # uuid -> how many of its XIDs were read


def _state() -> list[dict]:
    path = os.environ.get(STATE_ENV)
    if not path or not os.path.exists(path):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    return json.loads(Path(path).read_text())["gpus"]


def _check_started() -> None:
    if not _started:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _handle(index: int):
    return ctypes.cast(ctypes.c_void_p(_BASE + index), c_nvmlDevice_t)


def _gpu(handle, lost_ok: bool = False) -> dict:
    """The GPU behind a handle; GpuIsLost for a lost one (unless ``lost_ok``)."""
    _check_started()
    gpus = _state()
    index = (ctypes.cast(handle, ctypes.c_void_p).value or 0) - _BASE
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[index]
    if gpu.get("lost") and not lost_ok:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


# -- the functions the sampler calls --------------------------------------------------
def nvmlInit() -> None:
    global _started
    _state()  # no file: no driver
    with _lock:
        _started += 1


def nvmlShutdown() -> None:
    global _started
    with _lock:
        _started = max(0, _started - 1)


def nvmlDeviceGetCount() -> int:
    _check_started()
    return len(_state())


def nvmlDeviceGetHandleByIndex(index: int):
    handle = _handle(index)
    _gpu(handle)  # a lost GPU answers GpuIsLost here already, as NVML does
    return handle


def nvmlDeviceGetUUID(handle) -> str:
    return _gpu(handle)["uuid"]


def nvmlDeviceGetName(handle) -> str:
    return _gpu(handle).get("name", "NVIDIA A100-SXM4-80GB")


def nvmlDeviceGetMemoryInfo(handle):
    gpu = _gpu(handle)
    total, used = gpu.get("memory_total", 80 * 2**30), gpu.get("memory_used", 0)
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle):
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=gpu.get("gpu_util", 0), memory=gpu.get("mem_util", 0))


def nvmlDeviceGetTemperature(handle, sensor: int) -> int:
    return _gpu(handle).get("temperature", 40)


def nvmlDeviceGetPowerUsage(handle) -> int:
    return _gpu(handle).get("power_mw", 100_000)


def nvmlDeviceGetTotalEnergyConsumption(handle) -> int:
    return _gpu(handle).get("energy_mj", 1_000_000)


def nvmlDeviceGetMigMode(handle) -> list[int]:
    _gpu(handle)
    return [NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE]


def nvmlDeviceGetComputeRunningProcesses(handle) -> list:
    _gpu(handle)
    return []


def nvmlDeviceGetGraphicsRunningProcesses(handle) -> list:
    _gpu(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a datacenter board without graphics


def nvmlDeviceGetTotalEccErrors(handle, error_type: int, counter_type: int) -> int:
    gpu = _gpu(handle)
    if gpu.get("ecc") is False:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a board without ECC (or it is off)
    if (error_type, counter_type) != (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    ):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # the stand-in counts only these
    return gpu.get("ecc_uncorrected", 0)


def nvmlEventSetCreate() -> _EventSet:
    _check_started()
    return _EventSet()


def nvmlDeviceRegisterEvents(handle, event_types: int, event_set: _EventSet) -> None:
    gpu = _gpu(handle)
    if gpu.get("events") is False:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if event_types & ~nvmlEventTypeXidCriticalError:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # the stand-in raises XIDs only
    with _lock:
        event_set.delivered.setdefault(gpu["uuid"], len(gpu.get("xids", [])))


def nvmlEventSetWait_v2(event_set: _EventSet, timeoutms: int):
    """The next XID not yet read from this set; ``NVMLError_Timeout`` when none (the
    stand-in never waits: its events are already there or they are not)."""
    _check_started()
    for index, gpu in enumerate(_state()):
        uuid = gpu["uuid"]
        with _lock:
            if uuid not in event_set.delivered:
                continue
            seen = event_set.delivered[uuid]
            xids = gpu.get("xids", [])
            if seen >= len(xids):
                continue
            event_set.delivered[uuid] = seen + 1
        return c_nvmlEventData_t(
            device=_handle(index),
            eventType=nvmlEventTypeXidCriticalError,
            eventData=xids[seen],
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetWait(event_set: _EventSet, timeoutms: int):
    return nvmlEventSetWait_v2(event_set, timeoutms)


def nvmlEventSetFree(event_set: _EventSet) -> None:
    event_set.delivered.clear()


# -- what a test tells it ------------------------------------------------------------
class FakeDriver:
    """The GPUs the stand-in answers for, in a JSON file any process can read."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            self._write([])

    def env(self) -> dict[str, str]:
        """What a process needs to sample these GPUs through the stand-in."""
        return {"GPULAB_NVML_MODULE": MODULE, STATE_ENV: str(self.path)}

    def gpus(self) -> list[dict]:
        return json.loads(self.path.read_text())["gpus"]

    def _write(self, gpus: list[dict]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": gpus}))
        os.replace(tmp, self.path)  # readers never see half a file

    def _change(self, uuid: str, change) -> None:
        gpus = self.gpus()
        [gpu] = [g for g in gpus if g["uuid"] == uuid]
        change(gpu)
        self._write(gpus)

    def add_gpu(self, uuid: str, name: str = "NVIDIA A100-SXM4-80GB", **fields) -> None:
        """Another GPU: ``memory_total``, ``ecc=False`` (no ECC), ``events=False``..."""
        self._write(
            [*self.gpus(), {"uuid": uuid, "name": name, "xids": [], "ecc_uncorrected": 0, **fields}]
        )

    def raise_xid(self, uuid: str, code: int) -> None:
        self._change(uuid, lambda g: g["xids"].append(code))

    def count_ecc(self, uuid: str, errors: int = 1) -> None:
        self._change(uuid, lambda g: g.update(ecc_uncorrected=g["ecc_uncorrected"] + errors))

    def lose(self, uuid: str) -> None:
        self._change(uuid, lambda g: g.update(lost=True))
