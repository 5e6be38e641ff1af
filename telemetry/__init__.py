"""gpulab.telemetry: what a node's GPUs, NICs, RDMA ports and dataset cache are doing.

* ``collect.NodeSampler().sample()`` -> one sample dict (shape in ``sample.py``);
  the service calls it directly in the embedded default.
* ``agent.main(argv)`` -> ``gpulab agent``: samples at an interval and POSTs them.
* ``exporter.SampleCollector`` / ``exporter.render`` -> Prometheus metrics with
  dcgm-exporter's labels.

Samplers, one module each: ``nvml`` (GPUs, MIG, per-process memory by
JupyterHub user), ``nic`` (/sys/class/net), ``rdma`` (/sys/class/infiniband),
``cache_sampler`` (gpulab.cache counters).
"""

from .collect import NodeSampler
from .exporter import SampleCollector, render
from .sample import SAMPLE_VERSION, SourceMissing, empty_sample, validate_sample

__all__ = [
    "NodeSampler",
    "SampleCollector",
    "render",
    "SAMPLE_VERSION",
    "SourceMissing",
    "empty_sample",
    "validate_sample",
]
