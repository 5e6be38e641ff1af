"""Requests/s and p99 latency of a deployment, from its replicas' own metrics.

Each model server exports ``gpulab_serving_request_duration_seconds`` (a
histogram over all its models and codes). The deployment manager hands the
texts of every ready replica to :meth:`RequestStats.update` every few seconds;
the difference between two scrapes gives the rate and the quantile over that
window, as Prometheus' ``rate`` and ``histogram_quantile`` would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAM = "gpulab_serving_request_duration_seconds"

#: What the listing shows where the service cannot ask each replica (Kubernetes).
UNKNOWN = {"requests_total": None, "requests_per_second": None, "p99_latency_ms": None}


@dataclass
class Histogram:
    count: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count

    def add(self, text: str) -> None:
        """Add one replica's request-duration histogram (all models, all codes)."""
        for family in text_string_to_metric_families(text):
            if family.name != HISTOGRAM:
                continue
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    self.buckets[le] = self.buckets.get(le, 0) + s.value
                elif s.name.endswith("_count"):
                    self.count += s.value

    def since(self, before: Histogram) -> dict[float, float]:
        """The buckets' growth since ``before`` (an earlier scrape)."""
        return {le: n - before.buckets.get(le, 0) for le, n in self.buckets.items()}


def quantile_ms(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of cumulative ``le`` buckets, interpolated within its bucket as
    Prometheus' ``histogram_quantile`` does; in ms. None without observations."""
    total = buckets.get(float("inf"), 0)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in sorted(buckets):
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower * 1000  # beyond the largest bound: report that bound
            inside = buckets[le] - below
            fraction = (rank - below) / inside if inside > 0 else 1.0
            return (lower + (le - lower) * fraction) * 1000
        lower, below = le, buckets[le]
    return None


@dataclass
class RequestStats:
    """One deployment's traffic, as of the last two scrapes."""

    shown: dict = field(default_factory=dict)
    _at: float | None = None
    _last: Histogram | None = None

    def update(self, texts: list[str] | None, now: float | None = None) -> dict:
        """Take a new scrape (the replicas' metrics texts; None: cannot be known)."""
        if texts is None:
            self.shown = dict(UNKNOWN)
            return self.shown
        now = time.monotonic() if now is None else now
        totals = Histogram()
        for text in texts:
            totals.add(text)
        shown = {"requests_total": int(totals.count)}
        if self._last is not None and now > self._at:
            shown["requests_per_second"] = max(0.0, totals.count - self._last.count) / (
                now - self._at
            )
            shown["p99_latency_ms"] = quantile_ms(totals.since(self._last), 0.99)
        self._at, self._last, self.shown = now, totals, shown
        return shown

    def view(self) -> dict:
        """The three fields of a deployment's listing."""
        return {
            "requests_total": self.shown.get("requests_total", 0),
            "requests_per_second": self.shown.get("requests_per_second", 0.0),
            "p99_latency_ms": self.shown.get("p99_latency_ms"),
        }
