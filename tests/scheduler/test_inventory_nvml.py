"""Inventory from NVML. No GPU here: NVML is replaced by the telemetry tests'
stand-in (tests/telemetry/fake_nvml.py), which raises pynvml's real errors.
On a GPU machine, test_real_nvml_inventory reads the real driver."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "telemetry"))

from fake_nvml import FakeDevice, FakeNvml  # noqa: E402

from gpulab.backend import local_inventory as inventory  # noqa: E402

GIB = 1024**3


def with_fake(monkeypatch, devices, init_error=None):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(devices, init_error=init_error))


def test_whole_gpus_and_mig_devices(monkeypatch):
    h100 = FakeDevice("GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * GIB, 0)
    mig = FakeDevice(
        "GPU-bbbb",
        "NVIDIA H100 80GB HBM3",
        80 * GIB,
        0,
        mig={
            0: FakeDevice("MIG-1111", "1g.10gb", 10 * GIB, 0),
            3: FakeDevice("MIG-2222", "3g.40gb", 40 * GIB, 0),
        },
    )
    with_fake(monkeypatch, [h100, mig])
    gpus, reason = inventory.nvml_inventory(node="n1")
    assert reason is None
    assert [(g.uuid, g.memory_mib, g.mig_parent) for g in gpus] == [
        ("GPU-aaaa", 80 * 1024, None),
        ("MIG-1111", 10 * 1024, "GPU-bbbb"),
        ("MIG-2222", 40 * 1024, "GPU-bbbb"),
    ]
    assert [g.index for g in gpus] == [0, 1, 2] and not any(g.simulated for g in gpus)


def test_driver_not_loaded_is_a_reason_not_a_crash(monkeypatch):
    import pynvml

    with_fake(monkeypatch, [], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    gpus, reason = inventory.nvml_inventory()
    assert gpus == [] and "no NVIDIA driver" in reason


def test_real_nvml_inventory():
    gpus, reason = inventory.nvml_inventory()
    if not gpus:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
    assert all(g.uuid.startswith(("GPU-", "MIG-")) and g.memory_mib > 0 for g in gpus)
