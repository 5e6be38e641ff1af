"""The shape of one node sample: what the agent POSTs and the exporter reads.

A sample is a plain JSON object, so the agent, the service and the widgets
share it without sharing classes::

    {
      "version": 1,
      "ts": 1764400000.25,            # unix seconds when it was taken
      "node": "gpu-node-3",           # hostname unless --node says otherwise
      "gpus": [GPU, ...],             # nvml.py
      "nics": [NIC, ...],             # nic.py
      "rdma": [RDMA_PORT, ...],       # rdma.py
      "cache": CACHE or null,         # cache_sampler.py
      "missing": {"gpu": "no NVIDIA driver (NVMLError_LibraryNotFound)", ...},
      "allreduce": [ALLREDUCE, ...]   # optional; from all-reduce benchmarks
    }

``missing`` says, per source (``gpu``, ``nic``, ``rdma``, ``cache``), why it
gave nothing; a source that worked is absent from it. Numbers are base units
(bytes, watts, joules, celsius, ratios 0-1); a value a device cannot report is
``null``, with the NVML error under the item's ``errors``.
"""

from __future__ import annotations

import math
import socket
import time
from typing import Any

SAMPLE_VERSION = 1
SOURCES = ("gpu", "nic", "rdma", "cache")


def empty_sample(node: str | None = None, ts: float | None = None) -> dict[str, Any]:
    return {
        "version": SAMPLE_VERSION,
        "ts": time.time() if ts is None else ts,
        "node": node or socket.gethostname(),
        "gpus": [],
        "nics": [],
        "rdma": [],
        "cache": None,
        "missing": {},
    }


def validate_sample(sample: Any) -> list[str]:
    """What is wrong with a received sample (empty when it is fine).

    For the service's receiving route: answer 400 with these problems rather
    than storing something the exporter cannot read.
    """
    if not isinstance(sample, dict):
        return ["a sample must be a JSON object"]
    problems = []
    if sample.get("version") != SAMPLE_VERSION:
        problems.append(f"version must be {SAMPLE_VERSION}")
    ts = sample.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        problems.append("ts must be unix seconds (a number)")
    if not isinstance(sample.get("node"), str) or not sample.get("node"):
        problems.append("node must be a non-empty string")
    for key in ("gpus", "nics", "rdma"):
        items = sample.get(key)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            problems.append(f"{key} must be a list of objects")
    if sample.get("cache") is not None and not isinstance(sample.get("cache"), dict):
        problems.append("cache must be an object or null")
    missing = sample.get("missing")
    if not isinstance(missing, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in missing.items()
    ):
        problems.append("missing must map source names to reasons (strings)")
    allreduce = sample.get("allreduce", [])
    if not isinstance(allreduce, list) or not all(isinstance(i, dict) for i in allreduce):
        problems.append("allreduce, when present, must be a list of objects")
    return problems


class SourceMissing(Exception):
    """A sampler has nothing to report on this node; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
