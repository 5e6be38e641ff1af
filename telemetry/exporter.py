"""Prometheus metrics from node samples, named and labelled like dcgm-exporter.

GPU series carry ``hostname``, ``gpu`` (index), ``UUID`` and ``modelName`` as
dcgm-exporter does, so ``on(UUID)`` joins work across both. A MIG device's
series carry its parent's ``gpu`` and ``UUID`` plus ``GPU_I_ID`` and
``GPU_I_PROFILE`` (empty for a whole GPU, which Prometheus treats as absent).
Values a device could not report are left out rather than exported as 0.

GPU health (whole GPUs only; the fields of :mod:`.gpu_health`):
``gpulab_gpu_xid_errors_total`` and ``gpulab_gpu_ecc_uncorrected_errors_total``
(counters), ``gpulab_gpu_last_xid`` (the latest XID code, 0 before any, like
``DCGM_FI_DEV_XID_ERRORS``) and ``gpulab_gpu_lost`` (0/1). Whether the service
has cordoned a GPU (``gpulab_gpu_cordoned``) is the ledger's, exported by the service.

The service registers ``SampleCollector(latest_samples)``; ``render(samples)``
gives the text format in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GPU_LABELS = ["hostname", "gpu", "UUID", "modelName", "GPU_I_ID", "GPU_I_PROFILE"]

# (metric name, sample field, help, kind)
GPU_METRICS = [
    (
        "gpulab_gpu_utilization_ratio",
        "utilization_ratio",
        "Fraction of time a kernel was running on the GPU (0-1).",
        "gauge",
    ),
    (
        "gpulab_gpu_memory_utilization_ratio",
        "memory_utilization_ratio",
        "Fraction of time device memory was read or written (0-1).",
        "gauge",
    ),
    ("gpulab_gpu_memory_used_bytes", "memory_used_bytes", "Device memory in use.", "gauge"),
    ("gpulab_gpu_memory_total_bytes", "memory_total_bytes", "Device memory in total.", "gauge"),
    ("gpulab_gpu_temperature_celsius", "temperature_celsius", "GPU core temperature.", "gauge"),
    ("gpulab_gpu_power_watts", "power_watts", "Power draw of the board.", "gauge"),
    (
        "gpulab_gpu_energy_joules",
        "energy_joules",
        "Energy used since the driver was loaded.",
        "counter",
    ),
]


# (metric name, sample field, help, kind): whole GPUs only.
GPU_HEALTH_METRICS = [
    (
        "gpulab_gpu_xid_errors",
        "xid_errors_total",
        "Critical XID events NVML reported for the GPU since the sampler started.",
        "counter",
    ),
    (
        "gpulab_gpu_last_xid",
        "last_xid",
        "Code of the GPU's latest critical XID event (0: none yet), like DCGM_FI_DEV_XID_ERRORS.",
        "gauge",
    ),
    (
        "gpulab_gpu_ecc_uncorrected_errors",
        "ecc_uncorrected_errors_total",
        "Uncorrectable (double-bit) ECC errors since the driver loaded (volatile count).",
        "counter",
    ),
    (
        "gpulab_gpu_lost",
        "lost",
        "1 when NVML answers GpuIsLost for the GPU (fallen off the bus), else 0.",
        "gauge",
    ),
]


def _number(value) -> float | None:
    """A reading as a float, or None for absent and malformed ones.

    Samples arrive over HTTP from agents of any version; one bad field must
    cost its own series, not the whole scrape.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _family(name: str, help_text: str, labels: list[str], kind: str) -> Metric:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, help_text, labels=labels)


def _gpu_label_rows(sample: dict) -> Iterator[tuple[list[str], dict]]:
    """(labels, readings) for every GPU and MIG device of a sample."""
    host = sample["node"]
    for gpu in sample.get("gpus", []):
        gpu_index, uuid = str(gpu.get("index", "")), gpu.get("uuid") or ""
        model = gpu.get("name") or ""
        yield [host, gpu_index, uuid, model, "", ""], gpu
        for mig in gpu.get("mig", []):
            yield (
                [
                    host,
                    gpu_index,
                    uuid,
                    model,
                    str(mig.get("gpu_instance_id", "")),
                    mig.get("profile") or "",
                ],
                mig,
            )


def _add(family: Metric, labels: list[str], value) -> None:
    number = _number(value)
    if number is not None:
        family.add_metric(labels, number)


class SampleCollector:
    """A prometheus_client collector over whatever ``samples()`` returns now.

    ``samples`` gives the latest sample of each node (the service's store).
    """

    def __init__(self, samples: Callable[[], Iterable[dict]]):
        self._samples = samples

    def describe(self) -> list:
        # Nothing to check at registration; the series depend on the samples.
        return []

    def collect(self) -> Iterator[Metric]:
        samples = [s for s in self._samples() if isinstance(s, dict) and s.get("node")]
        yield from self._gpu_metrics(samples)
        yield from self._network_metrics(samples)
        yield from self._cache_metrics(samples)
        yield from self._health_metrics(samples)

    def _gpu_metrics(self, samples: list[dict]) -> Iterator[Metric]:
        rows = [row for s in samples for row in _gpu_label_rows(s)]
        for name, field, help_text, kind in GPU_METRICS:
            family = _family(name, help_text, GPU_LABELS, kind)
            for labels, readings in rows:
                value = _number(readings.get(field))
                if value is not None:
                    family.add_metric(labels, value)
            yield family
        per_user = GaugeMetricFamily(
            "gpulab_gpu_user_memory_used_bytes",
            "Device memory held by a JupyterHub user's processes ('' = unknown).",
            labels=GPU_LABELS + ["user"],
        )
        for labels, readings in rows:
            totals: dict[str, float] = {}
            for proc in readings.get("processes") or []:
                user = str(proc.get("user") or "")
                totals[user] = totals.get(user, 0) + (_number(proc.get("memory_used_bytes")) or 0)
            for user, used in sorted(totals.items()):
                per_user.add_metric(labels + [user], used)
        yield per_user
        whole = [(labels, gpu) for labels, gpu in rows if not labels[4]]
        for name, field, help_text, kind in GPU_HEALTH_METRICS:
            family = _family(name, help_text, GPU_LABELS, kind)
            for labels, gpu in whole:
                value = gpu.get(field)
                if isinstance(value, bool):  # lost: a flag, exported as 0/1
                    value = int(value)
                _add(family, labels, value)
            yield family

    def _network_metrics(self, samples: list[dict]) -> Iterator[Metric]:
        nic_rx = CounterMetricFamily(
            "gpulab_nic_receive_bytes",
            "Bytes received by a network interface.",
            labels=["hostname", "device"],
        )
        nic_tx = CounterMetricFamily(
            "gpulab_nic_transmit_bytes",
            "Bytes sent by a network interface.",
            labels=["hostname", "device"],
        )
        ib_rx = CounterMetricFamily(
            "gpulab_rdma_receive_bytes",
            "Bytes received by an RDMA port.",
            labels=["hostname", "device", "port"],
        )
        ib_tx = CounterMetricFamily(
            "gpulab_rdma_transmit_bytes",
            "Bytes sent by an RDMA port.",
            labels=["hostname", "device", "port"],
        )
        busbw = GaugeMetricFamily(
            "gpulab_allreduce_busbw_bytes_per_second",
            "Bus bandwidth of the latest all-reduce measurement (nccl-tests definition).",
            labels=["hostname", "job", "backend", "size_bytes"],
        )
        for s in samples:
            host = s["node"]
            for nic in s.get("nics") or []:
                labels = [host, str(nic.get("device", ""))]
                _add(nic_rx, labels, nic.get("rx_bytes"))
                _add(nic_tx, labels, nic.get("tx_bytes"))
            for port in s.get("rdma") or []:
                labels = [host, str(port.get("device", "")), str(port.get("port", ""))]
                _add(ib_rx, labels, port.get("rx_bytes"))
                _add(ib_tx, labels, port.get("tx_bytes"))
            for run in s.get("allreduce") or []:
                _add(
                    busbw,
                    [
                        host,
                        str(run.get("job", "")),
                        str(run.get("backend", "")),
                        str(run.get("size_bytes", "")),
                    ],
                    run.get("busbw_bytes_per_second"),
                )
        yield from (nic_rx, nic_tx, ib_rx, ib_tx, busbw)

    def _cache_metrics(self, samples: list[dict]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "gpulab_dataset_cache_requests",
            "Shard reads, by whether the cache had them.",
            labels=["hostname", "result"],
        )
        volume = CounterMetricFamily(
            "gpulab_dataset_cache_bytes",
            "Bytes read by datasets, by where they came from.",
            labels=["hostname", "source"],
        )
        evictions = CounterMetricFamily(
            "gpulab_dataset_cache_evictions",
            "Shards evicted to stay within capacity.",
            labels=["hostname"],
        )
        prefetched = CounterMetricFamily(
            "gpulab_dataset_cache_prefetched_shards",
            "Shards fetched ahead of the reader.",
            labels=["hostname"],
        )
        used = GaugeMetricFamily(
            "gpulab_dataset_cache_used_bytes",
            "Bytes held by the node's dataset cache.",
            labels=["hostname"],
        )
        capacity = GaugeMetricFamily(
            "gpulab_dataset_cache_capacity_bytes",
            "Capacity of the node's dataset cache.",
            labels=["hostname"],
        )
        for s in samples:
            cache, host = s.get("cache"), s["node"]
            if not cache:
                continue
            _add(requests, [host, "hit"], cache.get("hits"))
            _add(requests, [host, "miss"], cache.get("misses"))
            _add(volume, [host, "cache"], cache.get("bytes_from_cache"))
            _add(volume, [host, "remote"], cache.get("bytes_from_remote"))
            _add(evictions, [host], cache.get("evictions"))
            _add(prefetched, [host], cache.get("prefetch_ahead"))
            _add(used, [host], cache.get("used"))
            _add(capacity, [host], cache.get("capacity"))
        yield from (requests, volume, evictions, prefetched, used, capacity)

    def _health_metrics(self, samples: list[dict]) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpulab_telemetry_source_up",
            "1 when a telemetry source reported on the node, else 0.",
            labels=["hostname", "source"],
        )
        taken = GaugeMetricFamily(
            "gpulab_telemetry_sample_timestamp_seconds",
            "When the node's latest sample was taken (unix time).",
            labels=["hostname"],
        )
        for s in samples:
            for source in ("gpu", "nic", "rdma", "cache"):
                up.add_metric([s["node"], source], 0 if source in s.get("missing", {}) else 1)
            _add(taken, [s["node"]], s.get("ts"))
        yield from (up, taken)


def render(samples: Iterable[dict]) -> bytes:
    """The Prometheus text exposition of ``samples``."""
    registry = CollectorRegistry()
    frozen = list(samples)
    registry.register(SampleCollector(lambda: frozen))
    return generate_latest(registry)
