"""The router's arithmetic: the autoscaler's rule, the split between versions, the
in-flight average and the last minute's p99 (gpulab.service.endpoints.autoscale and
gpulab.service.endpoints.traffic). Pure functions and a fake clock; the live
behaviour is in test_endpoint_scaling.py."""

from collections import Counter

import pytest

from gpulab.service.endpoints.autoscale import UP_WINDOW_S, Autoscaler, needed
from gpulab.service.endpoints.traffic import UnitTraffic, WeightedChoice, quantile_ms
from gpulab.service.endpoints.versions import rollback_reason


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def scaler(low=1, high=4, target=4.0, delay=60.0):
    return Autoscaler(low, high, target, delay)


def feed(s, start, seconds, inflight):
    for t in range(int(seconds)):
        s.observe(start + t, inflight)
    return start + seconds


def test_needed_rounds_up_and_is_zero_only_without_calls():
    assert [needed(x, 4) for x in (0, 0.01, 4, 4.01, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_grows_at_once_to_what_the_load_needs_within_the_bounds():
    s = scaler()
    now = feed(s, 0, UP_WINDOW_S, 10)  # 10 in flight at 4 per replica: 3 replicas
    assert s.decide(now, current=1) == 3
    now = feed(s, now, UP_WINDOW_S, 100)
    assert s.decide(now, current=3) == 4  # never beyond max_replicas


def test_shrinks_only_after_the_delay_and_to_the_peak_within_it():
    s = scaler(delay=60)
    now = feed(s, 0, 10, 16)
    s.changed(now)
    assert s.decide(now, current=4) == 4
    now = feed(s, now, 30, 5)  # lighter load, 30 s in: too early
    assert s.decide(now, current=4) == 4
    now = feed(s, now, 40, 5)  # 70 s since the change, the peak of the last 60 s is 5
    assert s.decide(now, current=4) == 2


def test_min_zero_goes_to_zero_when_idle_and_a_waiting_call_starts_one():
    s = scaler(low=0, delay=5)
    now = feed(s, 0, 10, 0)
    assert s.decide(now, current=1) == 0
    assert s.decide(now, current=0, waiting=1) == 1
    fixed = scaler(low=2, high=2)
    assert fixed.decide(now, current=2) == 2 and fixed.decide(now, current=0) == 2


def test_weighted_choice_splits_exactly_and_spreads_calls():
    choice = WeightedChoice()
    picks = [choice.pick({"stable": 80, "canary": 20}) for _ in range(200)]
    assert Counter(picks) == {"stable": 160, "canary": 40}
    # Spread out: never more than 4 stable calls in a row at 80/20.
    runs = "".join("s" if p == "stable" else "c" for p in picks)
    assert "sssss" not in runs
    assert choice.pick({"a": 0, "b": 0}) is None
    assert {choice.pick({"a": 100, "b": 0}) for _ in range(5)} == {"a"}


def test_in_flight_is_averaged_over_time_between_samples():
    clock = Clock()
    t = UnitTraffic(clock)
    t.sample()
    t.begin(0)
    t.begin(1)
    clock.now += 0.5
    t.end(0, 0.5, error=False)
    clock.now += 0.5
    # Two calls for half a second, one for the other half: 1.5 on average.
    assert t.sample() == pytest.approx(1.5)
    assert t.least_busy([(0, "a"), (1, "b")]) == (0, "a")
    t.start_wait()
    clock.now += 1.0
    assert t.sample() == pytest.approx(2.0)  # the one in flight and the one waiting


def test_window_counts_calls_errors_and_p99_of_the_last_minute():
    clock = Clock()
    t = UnitTraffic(clock)
    for i in range(100):
        t.begin(0)
        t.end(0, 0.004 if i < 98 else 0.4, error=i >= 95)
    w = t.window()
    assert (w["calls"], w["errors"], w["error_rate"]) == (100, 5, 0.05)
    assert 5 < w["p99_latency_ms"] <= 500  # in the bucket of the two slow calls
    clock.now += 120
    assert t.window()["calls"] == 0 and t.calls_total == 100


def test_quantile_interpolates_within_its_bucket_as_prometheus_does():
    buckets = {0.1: 50.0, 0.2: 100.0, float("inf"): 100.0}
    assert quantile_ms(buckets, 0.75) == pytest.approx(150.0)
    assert quantile_ms({float("inf"): 0.0}, 0.99) is None


def test_a_canary_is_rolled_back_only_past_the_margin_with_enough_calls():
    stable = {"calls": 100, "error_rate": 0.01}
    assert rollback_reason(stable, {"calls": 50, "error_rate": 0.30}, 0.05, 1) is not None
    assert rollback_reason(stable, {"calls": 50, "error_rate": 0.05}, 0.05, 1) is None
    assert rollback_reason(stable, {"calls": 5, "error_rate": 1.0}, 0.05, 1) is None
