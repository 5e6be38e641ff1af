"""The Prometheus exporter, read back with prometheus_client's own parser."""

import os

from fake_nvml import FakeDevice, FakeNvml, a100_mig_3g20gb
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gpulab.cache as cache
from gpulab.telemetry.cache_sampler import CacheSampler
from gpulab.telemetry.collect import NodeSampler
from gpulab.telemetry.exporter import SampleCollector, render
from gpulab.telemetry.nic import NicSampler
from gpulab.telemetry.nvml import NvmlSampler
from gpulab.telemetry.rdma import RdmaSampler

GiB = 2**30


def series(text):
    """{(sample name, frozenset(labels)): value}, and the family types."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


def labels(**kw):
    return frozenset(kw.items())


def node_sample(tmp_path, user_pid=None):
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"x" * 1000)
    cache_dir = str(tmp_path / "cache")
    for _ in range(3):
        with cache.open(str(shard), cache_dir=cache_dir) as f:
            f.read()
    mig = {0: a100_mig_3g20gb(processes=[(user_pid or os.getpid(), 3 * GiB)])}
    fake = FakeNvml(
        [
            FakeDevice(
                "GPU-aaaa",
                "NVIDIA H200",
                141 * GiB,
                30 * GiB,
                gpu_util=75,
                temperature=55,
                power_mw=None,
                energy_mj=5_000_000,
                processes=[(user_pid or os.getpid(), 30 * GiB)],
            ),
            FakeDevice(
                "GPU-bbbb",
                "NVIDIA A100-SXM4-40GB",
                40 * GiB,
                4 * GiB,
                gpu_util=10,
                power_mw=250_500,
                mig=mig,
            ),
        ]
    )
    sampler = NodeSampler(
        node="node-7",
        samplers={
            "gpu": NvmlSampler(fake),
            "nic": NicSampler(),
            "rdma": RdmaSampler(),
            "cache": CacheSampler(cache_dir),
        },
    )
    sample = sampler.sample()
    sample["allreduce"] = [
        {
            "job": "job-42",
            "backend": "gloo",
            "size_bytes": 2**26,
            "ranks": 2,
            "busbw_bytes_per_second": 1.5e9,
        }
    ]
    return sample


def test_names_labels_and_values(tmp_path, hub_user_process):
    sample = node_sample(tmp_path, user_pid=hub_user_process[1])
    values, types = series(render([sample]).decode())

    gpu0 = dict(
        hostname="node-7",
        gpu="0",
        UUID="GPU-aaaa",
        modelName="NVIDIA H200",
        GPU_I_ID="",
        GPU_I_PROFILE="",
    )
    assert values[("gpulab_gpu_utilization_ratio", labels(**gpu0))] == 0.75
    assert values[("gpulab_gpu_memory_used_bytes", labels(**gpu0))] == 30 * GiB
    assert values[("gpulab_gpu_memory_total_bytes", labels(**gpu0))] == 141 * GiB
    assert values[("gpulab_gpu_temperature_celsius", labels(**gpu0))] == 55
    assert values[("gpulab_gpu_energy_joules_total", labels(**gpu0))] == 5000
    assert types["gpulab_gpu_energy_joules"] == "counter"
    # Power was not supported on GPU 0: absent, not 0.
    assert ("gpulab_gpu_power_watts", labels(**gpu0)) not in values
    per_user = ("gpulab_gpu_user_memory_used_bytes", labels(**gpu0, user="alice"))
    assert values[per_user] == 30 * GiB

    gpu1 = dict(hostname="node-7", gpu="1", UUID="GPU-bbbb", modelName="NVIDIA A100-SXM4-40GB")
    whole1 = labels(**gpu1, GPU_I_ID="", GPU_I_PROFILE="")
    assert values[("gpulab_gpu_power_watts", whole1)] == 250.5
    mig = labels(**gpu1, GPU_I_ID="1", GPU_I_PROFILE="3g.20gb")
    assert values[("gpulab_gpu_memory_used_bytes", mig)] == 4 * GiB
    assert ("gpulab_gpu_utilization_ratio", mig) not in values
    assert (
        values[
            (
                "gpulab_gpu_user_memory_used_bytes",
                labels(**gpu1, GPU_I_ID="1", GPU_I_PROFILE="3g.20gb", user="alice"),
            )
        ]
        == 3 * GiB
    )

    for nic in sample["nics"]:
        key = labels(hostname="node-7", device=nic["device"])
        assert values[("gpulab_nic_receive_bytes_total", key)] == nic["rx_bytes"]
        assert values[("gpulab_nic_transmit_bytes_total", key)] == nic["tx_bytes"]
    assert types["gpulab_nic_receive_bytes"] == "counter"

    node = dict(hostname="node-7")
    assert values[("gpulab_dataset_cache_requests_total", labels(**node, result="hit"))] == 2
    assert values[("gpulab_dataset_cache_requests_total", labels(**node, result="miss"))] == 1
    assert values[("gpulab_dataset_cache_bytes_total", labels(**node, source="remote"))] == 1000
    assert values[("gpulab_dataset_cache_bytes_total", labels(**node, source="cache"))] == 2000
    assert values[("gpulab_dataset_cache_evictions_total", labels(hostname="node-7"))] == 0
    assert values[("gpulab_dataset_cache_used_bytes", labels(hostname="node-7"))] == 1000

    assert (
        values[
            (
                "gpulab_allreduce_busbw_bytes_per_second",
                labels(hostname="node-7", job="job-42", backend="gloo", size_bytes=str(2**26)),
            )
        ]
        == 1.5e9
    )
    up = {
        src: values[("gpulab_telemetry_source_up", labels(hostname="node-7", source=src))]
        for src in ("gpu", "nic", "rdma", "cache")
    }
    assert up == {"gpu": 1, "nic": 1, "rdma": 0 if "rdma" in sample["missing"] else 1, "cache": 1}


def test_every_name_follows_the_house_rules(tmp_path):
    _, types = series(render([node_sample(tmp_path)]).decode())
    for name, kind in types.items():
        assert name.startswith("gpulab_")
        assert kind in ("gauge", "counter")


def test_the_collector_follows_the_latest_samples(tmp_path):
    latest = {}
    registry = CollectorRegistry()
    registry.register(SampleCollector(lambda: latest.values()))
    assert b"gpulab_nic_receive_bytes_total{" not in generate_latest(registry)

    sample = NodeSampler(node="node-1", samplers={"nic": NicSampler()}).sample()
    latest["node-1"] = sample
    values, _ = series(generate_latest(registry).decode())
    assert any(name == "gpulab_nic_receive_bytes_total" for name, _ in values)

    other = dict(sample, node="node-2")
    latest["node-2"] = other
    values, _ = series(generate_latest(registry).decode())
    hosts = {
        dict(lbl)["hostname"]
        for name, lbl in values
        if name == "gpulab_telemetry_sample_timestamp_seconds"
    }
    assert hosts == {"node-1", "node-2"}


def test_malformed_readings_cost_only_their_own_series():
    sample = {
        "version": 1,
        "ts": 1.0,
        "node": "n1",
        "missing": {},
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-x",
                "utilization_ratio": "high",
                "memory_used_bytes": 5,
                "processes": [{"pid": 1}],
            }
        ],
        "nics": [{"device": "eth0", "rx_bytes": None, "tx_bytes": 7}, {}],
        "rdma": [],
        "cache": {"hits": 1},
    }
    values, _ = series(render([sample, {"not": "a sample"}]).decode())
    names = {name for name, _ in values}
    assert "gpulab_gpu_utilization_ratio" not in names
    assert "gpulab_gpu_memory_used_bytes" in names
    assert values[("gpulab_nic_transmit_bytes_total", labels(hostname="n1", device="eth0"))] == 7
    assert ("gpulab_nic_receive_bytes_total", labels(hostname="n1", device="eth0")) not in values
    assert values[("gpulab_dataset_cache_requests_total", labels(hostname="n1", result="hit"))] == 1
