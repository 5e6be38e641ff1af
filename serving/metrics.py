"""The model server's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Infer requests naming no model this server has are counted under this label, so
# a caller cannot grow the label set with made-up names.
UNKNOWN_MODEL = ""


class ServingMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpulab_serving_requests",
            "Inference requests answered, by model and HTTP status",
            ["model", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpulab_serving_request_duration_seconds",
            "Time from an inference request's arrival to its answer",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "gpulab_serving_batch_size",
            "Rows in each batch the model ran",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "gpulab_serving_queue_depth",
            "Inference requests waiting for a batch",
            ["model"],
            registry=self.registry,
        )

    def track_queue(self, model: str, depth: Callable[[], float]) -> None:
        self.queue_depth.labels(model=model).set_function(depth)

    def render(self) -> bytes:
        return generate_latest(self.registry)
