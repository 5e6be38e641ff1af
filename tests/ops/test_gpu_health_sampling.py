"""GPU health in telemetry: XID events, uncorrectable ECC errors and lost GPUs, as the
NVML sampler reports them and the exporter exports them.

NVML needs an NVIDIA driver, which this machine does not have: these tests run the
real sampler against ``support.fake_nvml``, a stand-in module built on pynvml's own
error classes, event and memory structures, loaded the way the service loads it
(``GPULAB_NVML_MODULE``).
"""

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fake_nvml import FakeDriver

from gpulab.telemetry import NodeSampler, render
from gpulab.telemetry.gpu_health import gpu_faults
from gpulab.telemetry.nvml import NvmlSampler

A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@pytest.fixture
def driver(tmp_path, monkeypatch):
    driver = FakeDriver(tmp_path / "nvml.json")
    driver.add_gpu(A)
    driver.add_gpu(B)
    for name, value in driver.env().items():
        monkeypatch.setenv(name, value)
    return driver


@pytest.fixture
def sampler(driver):
    sampler = NvmlSampler()  # pynvml, or what GPULAB_NVML_MODULE names
    yield sampler
    sampler.close()


def by_uuid(gpus):
    return {g["uuid"]: g for g in gpus}


def test_xid_events_are_counted_per_gpu_and_reported_once(driver, sampler):
    first = by_uuid(sampler.sample())
    assert first[A]["xids"] == [] and first[A]["xid_errors_total"] == 0
    assert first[A]["last_xid"] == 0 and first[A]["lost"] is False
    assert "xids" not in first[A]["errors"]

    driver.raise_xid(A, 13)  # a program's illegal address: counted, not a GPU fault
    driver.raise_xid(A, 79)
    now = by_uuid(sampler.sample())
    assert now[A]["xids"] == [13, 79] and now[A]["xid_errors_total"] == 2
    assert now[A]["last_xid"] == 79
    assert now[B]["xids"] == [] and now[B]["xid_errors_total"] == 0
    assert gpu_faults(now[A], first[A]) == ["XID 79 (GPU has fallen off the bus)"]
    assert gpu_faults(now[B], first[B]) == []

    later = by_uuid(sampler.sample())
    assert later[A]["xids"] == [] and later[A]["xid_errors_total"] == 2
    assert later[A]["last_xid"] == 79
    assert gpu_faults(later[A], now[A]) == []


def test_uncorrectable_ecc_errors_count_from_the_driver(driver, sampler):
    driver.count_ecc(A, 3)  # before the sampler started: an old count
    first = by_uuid(sampler.sample())
    assert first[A]["ecc_uncorrected_errors_total"] == 3
    assert gpu_faults(first[A], None) == []
    driver.count_ecc(A, 2)
    now = by_uuid(sampler.sample())
    assert now[A]["ecc_uncorrected_errors_total"] == 5
    assert gpu_faults(now[A], first[A]) == ["2 uncorrectable ECC errors"]


def test_a_lost_gpu_keeps_its_uuid_and_its_last_xid(driver, sampler):
    sampler.sample()
    driver.raise_xid(B, 79)
    driver.lose(B)
    now = by_uuid(sampler.sample())
    gone = now[B]
    assert gone["lost"] is True
    assert gone["errors"]["handle"] == "NVMLError_GpuIsLost"
    # The event's device answers no more; its handle still says which GPU it was.
    assert gone["xids"] == [79]
    assert gpu_faults(gone) == [
        "GPU lost: NVML answers GpuIsLost (fallen off the bus)",
        "XID 79 (GPU has fallen off the bus)",
    ]
    assert now[A]["lost"] is False and now[A]["memory_total_bytes"] == 80 * 2**30


def test_what_a_board_cannot_tell_is_none_and_the_rest_stands(tmp_path, monkeypatch):
    driver = FakeDriver(tmp_path / "nvml.json")
    driver.add_gpu(A, ecc=False, events=False)  # a consumer board: no ECC, no events
    for name, value in driver.env().items():
        monkeypatch.setenv(name, value)
    sampler = NvmlSampler()
    [gpu] = sampler.sample()
    sampler.close()
    assert gpu["ecc_uncorrected_errors_total"] is None and gpu["xids"] is None
    assert gpu["errors"]["ecc_uncorrected_errors_total"] == "NVMLError_NotSupported"
    assert gpu["errors"]["xids"] == "NVMLError_NotSupported"
    assert gpu["lost"] is False and gpu["utilization_ratio"] == 0.0
    assert gpu_faults(gpu) == []


def test_xids_raised_before_a_gpu_is_registered_are_not_reported(driver, sampler):
    driver.raise_xid(A, 48)  # the sampler was not listening yet, as with NVML
    assert by_uuid(sampler.sample())[A]["xids"] == []


def series(text: str) -> dict[tuple[str, str], tuple[dict, float]]:
    """(sample name, UUID) -> (labels, value) of the exposition's GPU health series."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "UUID" in s.labels:
                out[(s.name, s.labels["UUID"])] = (s.labels, s.value)
    return out


def test_the_exporter_exports_gpu_health_with_dcgm_labels(driver):
    node = NodeSampler(node="gpu-node-1", samplers={"gpu": NvmlSampler()})
    node.sample()
    driver.raise_xid(A, 79)
    driver.count_ecc(B, 1)
    driver.lose(B)
    text = render([node.sample()]).decode()
    node.close()
    got = series(text)
    labels, value = got[("gpulab_gpu_xid_errors_total", A)]
    assert value == 1
    assert labels == {
        "hostname": "gpu-node-1",
        "gpu": "0",
        "UUID": A,
        "modelName": "NVIDIA A100-SXM4-80GB",
        "GPU_I_ID": "",
        "GPU_I_PROFILE": "",
    }
    assert got[("gpulab_gpu_last_xid", A)][1] == 79
    assert got[("gpulab_gpu_lost", A)][1] == 0
    assert got[("gpulab_gpu_ecc_uncorrected_errors_total", A)][1] == 0
    # B is lost: its flag is 1; what it can no longer tell is left out, not 0.
    assert got[("gpulab_gpu_lost", B)] == ({**labels, "gpu": "1", "UUID": B, "modelName": ""}, 1)
    assert ("gpulab_gpu_ecc_uncorrected_errors_total", B) not in got
    assert "# TYPE gpulab_gpu_xid_errors_total counter" in text
    assert "# TYPE gpulab_gpu_ecc_uncorrected_errors_total counter" in text
    assert "# TYPE gpulab_gpu_last_xid gauge" in text
