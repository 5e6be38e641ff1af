"""Requests/s and p99 from the replicas' histograms (gpulab.service.serving_metrics)."""

import pytest

from gpulab.service.serving_metrics import Histogram, RequestStats, quantile_ms


def replica_text(counts: dict[float, int]) -> str:
    """A model server's /metrics: the request-duration histogram, cumulative buckets."""
    name = "gpulab_serving_request_duration_seconds"
    lines = [f"# TYPE {name} histogram"]
    for le, n in counts.items():
        bound = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'{name}_bucket{{model="m",le="{bound}"}} {n}')
    lines.append(f'{name}_count{{model="m"}} {counts[float("inf")]}')
    lines.append(f'{name}_sum{{model="m"}} 1.0')
    return "\n".join(lines) + "\n"


def test_quantile_interpolates_within_its_bucket_as_prometheus_does():
    inf = float("inf")
    assert quantile_ms({0.01: 50, 0.1: 100, inf: 100}, 0.5) == pytest.approx(10.0)
    assert quantile_ms({0.01: 50, 0.1: 100, inf: 100}, 0.99) == pytest.approx(98.2)
    assert quantile_ms({0.01: 0, inf: 10}, 0.99) == pytest.approx(10.0)  # beyond: the bound
    assert quantile_ms({0.01: 0, inf: 0}, 0.99) is None


def test_histograms_of_replicas_add_up():
    inf = float("inf")
    h = Histogram()
    h.add(replica_text({0.01: 3, inf: 4}))
    h.add(replica_text({0.01: 1, inf: 2}))
    h.add("# TYPE other_metric counter\nother_metric_total 7\n")
    assert (h.count, h.buckets) == (6, {0.01: 4, inf: 6})


def test_rate_and_p99_over_the_window_between_scrapes():
    inf = float("inf")
    stats = RequestStats()
    assert stats.view() == {"requests_total": 0, "requests_per_second": 0.0, "p99_latency_ms": None}
    stats.update([replica_text({0.01: 10, inf: 10})], now=100.0)
    assert stats.view()["requests_total"] == 10 and stats.view()["p99_latency_ms"] is None
    stats.update([replica_text({0.01: 10, inf: 10}), replica_text({0.01: 0, inf: 20})], now=105.0)
    view = stats.view()
    assert view["requests_total"] == 30 and view["requests_per_second"] == pytest.approx(4.0)
    assert view["p99_latency_ms"] == pytest.approx(10.0)  # all 20 new ones beyond 10 ms
    # Where the replicas cannot be asked (Kubernetes), the listing says it does not know.
    assert RequestStats().update(None) == {
        "requests_total": None,
        "requests_per_second": None,
        "p99_latency_ms": None,
    }
