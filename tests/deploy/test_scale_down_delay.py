"""The scale-down delay: bounded, and held to a floor for versions holding GPUs.

- The autoscaler kept a sample per loop pass (up to five a second while a call waits
  for a cold start) for as long as the delay, which could be 7 days, and scanned them
  all on the event loop under the deployments' lock each pass. The delay is now at
  most an hour (a 400 that says the range), the samples one per second in a bounded
  deque, read from the newest end.
- A GPU endpoint with ``--replicas 0:N`` and a delay of 0 gave its slice back after
  each call and took one again at the next, preempting other users' borrowing batch
  jobs over and over: a version holding GPU slices scales down no sooner than
  ``c.Endpoints.min_gpu_scale_down_delay_s`` (60 s by default).
"""

from __future__ import annotations

import pytest
from traitlets import TraitError

from gpulab.service.endpoints.autoscale import (
    MAX_SAMPLES,
    MAX_SCALE_DOWN_DELAY_S,
    UP_WINDOW_S,
    Autoscaler,
)
from gpulab.service.endpoints.live import LiveEndpoints
from gpulab.service.endpoints.settings import DeployRefused, EndpointLimits, check_create
from gpulab.service.endpoints.site_settings import Endpoints

LIMITS = EndpointLimits(
    slice_sizes=(0, 250, 1000),
    max_deployment_replicas=4,
    max_user_deployments=5,
    max_model_mib=64,
    model_storage_quota_mib=64,
    cold_start_seconds=1.0,
    stop_with_server=False,
    local=False,
)


def create(**settings) -> dict:
    return check_create(LIMITS, "alice", {"name": "m", **settings}, lambda *a: None)


def test_a_delay_over_an_hour_is_refused_with_the_range():
    assert create(scale_down_delay_s=3600)["scale_down_delay_s"] == 3600.0
    with pytest.raises(DeployRefused) as refused:
        create(scale_down_delay_s=7 * 86400)
    assert refused.value.status == 400
    assert str(refused.value) == (
        "'scale_down_delay_s' must be a number from 0 to 3600, got 604800"
    )


def test_samples_are_one_a_second_and_bounded_whatever_the_delay():
    """Five passes a second for ten minutes: 600 samples kept, not 3,000; a row of
    before the cap (a week's delay) keeps at most an hour of them."""
    scaler = Autoscaler(0, 4, 4.0, 7 * 86400)
    now = 0.0
    for _ in range(5 * 600):
        scaler.observe(now, 2.0)
        now += 0.2
    assert len(scaler.samples) <= 601
    assert scaler.samples.maxlen == MAX_SAMPLES
    assert MAX_SAMPLES <= MAX_SCALE_DOWN_DELAY_S + UP_WINDOW_S + 2


def test_one_sample_a_second_decides_as_every_sample_did():
    """Up on the mean of the last seconds, down to the peak within the delay, with
    five passes a second kept as one sample a second."""
    scaler = Autoscaler(1, 4, 4.0, 60.0)
    tick = 0

    def run(seconds: int, inflight, burst_at: int | None = None) -> float:
        nonlocal tick
        for _ in range(5 * seconds):
            scaler.observe(tick / 5, 15.0 if tick == burst_at else inflight)
            tick += 1
        return tick / 5

    now = run(10, 12.0)  # 12 in flight at 4 a replica: 3
    assert scaler.decide(now, current=1) == 3
    scaler.changed(now)  # at 10 s
    now = run(30, 1.0, burst_at=5 * 20)  # a lull, with one pass of 15 in flight at 20 s
    assert scaler.decide(now, current=3) == 3  # 30 s of a 60 s delay: not yet
    now = run(31, 1.0)  # 71 s: the delay is over, the burst (4 replicas) is within it
    assert scaler.decide(now, current=3) == 3
    now = run(10, 1.0)  # 81 s: the burst is more than 60 s old
    assert scaler.decide(now, current=3) == 1


def live_with(floor: float) -> LiveEndpoints:
    class Store:
        def versions(self, dep_id):
            return []

    return LiveEndpoints(Store(), serving=None, gpu_delay_floor_s=floor)


def rows(gpu_milli: int, delay: float) -> tuple[dict, dict]:
    row = {
        "id": "d1",
        "user": "alice",
        "name": "m",
        "replicas": 0,
        "max_replicas": 2,
        "target_inflight": 4.0,
        "scale_down_delay_s": delay,
    }
    return row, {"id": "d1", "version": 1, "gpu_milli": gpu_milli, "replicas": 1}


def test_a_gpu_version_scales_down_no_sooner_than_the_floor():
    live = live_with(60.0)
    row, vrow = rows(gpu_milli=250, delay=0.0)
    scaler = live.record(row, [vrow]).units["d1"].scaler
    assert scaler.scale_down_delay_s == 60.0
    scaler.changed(0.0)
    scaler.observe(0.0, 1.0)  # one call, then nothing
    for t in range(1, 60):
        scaler.observe(float(t), 0.0)
        assert scaler.decide(float(t), current=1) == 1, t  # its slice is kept
    scaler.observe(61.0, 0.0)
    assert scaler.decide(61.0, current=1) == 0
    # A CPU version keeps the delay its deployment asks; a longer one stays as asked.
    row, vrow = rows(gpu_milli=0, delay=0.0)
    assert live.record(row, [vrow]).units["d1"].scaler.scale_down_delay_s == 0.0
    row, vrow = rows(gpu_milli=1000, delay=300.0)
    assert live.record(row, [vrow]).units["d1"].scaler.scale_down_delay_s == 300.0


def test_the_floor_is_a_site_setting_within_the_range():
    assert Endpoints().min_gpu_scale_down_delay_s == 60.0
    assert LIMITS.min_gpu_scale_down_delay_s == 60.0
    assert Endpoints(min_gpu_scale_down_delay_s=0).min_gpu_scale_down_delay_s == 0
    for bad in (-1, 3601):
        with pytest.raises(TraitError, match="min_gpu_scale_down_delay_s"):
            Endpoints(min_gpu_scale_down_delay_s=bad)
