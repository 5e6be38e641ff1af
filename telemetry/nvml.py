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
     "xid_errors_total": 1, "xids": [79], "last_xid": 79,
     "ecc_uncorrected_errors_total": 0, "lost": false,
     "errors": {"power_watts": "NVMLError_NotSupported"}}

Health (read by :func:`.gpu_health.gpu_faults`): critical XID events come from an
NVML event set every GPU is registered with (``xids``: the codes since the previous
sample; ``xid_errors_total``: all since the sampler started; ``last_xid``: the
latest code, 0 before any, like DCGM's ``DCGM_FI_DEV_XID_ERRORS``; ``None`` for a GPU
that cannot be registered, the reason under ``errors["xids"]``); uncorrectable
ECC errors are NVML's volatile count; ``lost`` is true once any call for the GPU
answers ``GpuIsLost``. A GPU whose handle is gone keeps the UUID seen before.

``GPULAB_NVML_MODULE`` (for tests and diagnostics) names a module to use instead
of ``pynvml``, with the same functions: tests/support/fake_nvml.py stands in for
a driver on machines without one.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import re
from collections.abc import Callable
from typing import Any

from .procs import jupyterhub_user, unix_user
from .sample import SourceMissing

#: The environment variable naming a pynvml-compatible module to use instead (tests).
NVML_MODULE_ENV = "GPULAB_NVML_MODULE"
#: Most events read in one sample (a storm of XIDs must not hold the sampler).
MAX_EVENTS_PER_SAMPLE = 1000
LOST = "NVMLError_GpuIsLost"
MISSING_FUNCTION = "NVMLError_FunctionNotFound"


def _load_pynvml():
    name = os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError:
        if name != "pynvml":
            raise SourceMissing(f"${NVML_MODULE_ENV}={name} cannot be imported") from None
        raise SourceMissing("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None


def _handle_key(handle) -> int:
    """The address behind an NVML device handle (a ctypes pointer): the same device
    answers with equal addresses, not with equal handle objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._uuid_by_index: dict[int, str] = {}
        self._reset_events()

    def _reset_events(self) -> None:
        self._events: Any = None  # the NVML event set, once created
        self._events_error: str | None = None  # why there is none / why reading failed
        self._registered: dict[str, str | None] = {}  # uuid -> None, or why it failed
        self._uuid_by_handle: dict[int, str] = {}
        self._xid_totals: dict[str, int] = {}
        self._last_xid: dict[str, int] = {}
        self._new_xids: dict[str, list[int]] = {}

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
        self._create_events()
        gpus = [self._gpu(i) for i in range(count)]
        self._drain_events()
        for gpu in gpus:
            self._xid_fields(gpu)
        return gpus

    def close(self) -> None:
        if self._started:
            self._started = False
            if self._events is not None:
                with contextlib.suppress(self._nvml.NVMLError, AttributeError):
                    self._nvml.nvmlEventSetFree(self._events)
            self._reset_events()
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # -- XID events ----------------------------------------------------------
    def _function(self, name: str) -> Callable | None:
        """An NVML function, or None where this pynvml (or stand-in) lacks it."""
        return getattr(self._nvml, name, None)

    def _create_events(self) -> None:
        if self._events is not None:
            return
        create = self._function("nvmlEventSetCreate")
        if create is None:
            self._events_error = MISSING_FUNCTION
            return
        try:
            self._events = create()
            self._events_error = None
        except self._nvml.NVMLError as err:
            self._events_error = type(err).__name__

    def _register(self, handle, uuid: str) -> None:
        """Register the GPU for critical XID events, once (a failure is kept and shown)."""
        if self._events is None or uuid in self._registered:
            return
        register = self._function("nvmlDeviceRegisterEvents")
        if register is None:
            self._registered[uuid] = MISSING_FUNCTION
            return
        try:
            register(handle, self._nvml.nvmlEventTypeXidCriticalError, self._events)
        except self._nvml.NVMLError as err:
            self._registered[uuid] = type(err).__name__
            return
        self._registered[uuid] = None
        self._uuid_by_handle[_handle_key(handle)] = uuid
        self._xid_totals.setdefault(uuid, 0)

    def _drain_events(self) -> None:
        """Read every event waiting in the set (timeout 0) into ``_new_xids``."""
        self._new_xids = {}
        if self._events is None:
            return
        wait = self._function("nvmlEventSetWait_v2") or self._function("nvmlEventSetWait")
        if wait is None:
            self._events_error = MISSING_FUNCTION
            return
        self._events_error = None
        nvml = self._nvml
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                event = wait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return  # none left
            except nvml.NVMLError as err:
                self._events_error = type(err).__name__
                return
            if not event.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = self._event_uuid(event.device)
            if uuid is not None:
                self._new_xids.setdefault(uuid, []).append(int(event.eventData))
                self._xid_totals[uuid] = self._xid_totals.get(uuid, 0) + 1
                self._last_xid[uuid] = int(event.eventData)

    def _event_uuid(self, device) -> str | None:
        """Which GPU an event is about: its UUID, or (a GPU that fell off the bus
        answers no more) the UUID its handle had when it was registered."""
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(device))
        except self._nvml.NVMLError:
            return self._uuid_by_handle.get(_handle_key(device))

    def _xid_fields(self, gpu: dict) -> None:
        uuid, errors = gpu.get("uuid"), gpu["errors"]
        if self._events is None:
            why = self._events_error
        elif uuid is None:
            why = errors.get("uuid") or errors.get("handle")
        else:
            why = self._registered.get(uuid, MISSING_FUNCTION)
        if why is not None:
            gpu["xid_errors_total"] = gpu["xids"] = gpu["last_xid"] = None
            errors["xids"] = why
            return
        gpu["xid_errors_total"] = self._xid_totals.get(uuid, 0)
        gpu["xids"] = self._new_xids.get(uuid, [])
        gpu["last_xid"] = self._last_xid.get(uuid, 0)
        if self._events_error:  # reading the set failed this time; what came is kept
            errors["xids"] = self._events_error

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
            # Gone (fallen off the bus, most likely): the UUID it had, for whoever cordons it.
            gpu["uuid"] = self._uuid_by_index.get(index)
            gpu["ecc_uncorrected_errors_total"] = None
            gpu["lost"] = errors["handle"] == LOST
            return gpu
        uuid = self._call(errors, "uuid", nvml.nvmlDeviceGetUUID, handle)
        if uuid is not None:
            uuid = self._uuid_by_index[index] = _text(uuid)
            self._register(handle, uuid)
        gpu["uuid"] = uuid if uuid is not None else self._uuid_by_index.get(index)
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
        gpu["ecc_uncorrected_errors_total"] = self._ecc_uncorrected(handle, errors)
        gpu["lost"] = LOST in errors.values() or any(
            LOST in m["errors"].values() for m in gpu["mig"]
        )
        return gpu

    def _ecc_uncorrected(self, handle, errors: dict) -> int | None:
        """Uncorrectable (double-bit) ECC errors since the driver loaded; None without ECC."""
        field = "ecc_uncorrected_errors_total"
        query = self._function("nvmlDeviceGetTotalEccErrors")
        if query is None:
            errors[field] = MISSING_FUNCTION
            return None
        nvml = self._nvml
        count = self._call(
            errors,
            field,
            query,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        return int(count) if count is not None else None

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
