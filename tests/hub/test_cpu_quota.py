"""CPU-only jobs and endpoints count against a per-user CPU quota.

A real hub with ``c.GpuLabService.user_cpu_quota = 2`` (cores) and one core
per CPU-only process; GPU slices are bounded by the milli-GPU quota instead.
"""

import time

import pytest
from hubproc import RunningHub

pytestmark = pytest.mark.slow
SLEEP = {"code": "import time\ntime.sleep(600)", "name": "sleeper"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(
        tmp_path_factory.mktemp("cpuquota"),
        simulate="1xA100-80GB",
        config="c.GpuLabService.user_cpu_quota = 2\nc.AccountLimits.cpu_floor = 1\n",
    )
    yield h
    for job in h.gpulab("GET", "/jobs").json():
        h.gpulab("DELETE", f"/jobs/{job['id']}")
    h.stop()


def test_cpu_only_work_stops_at_the_users_cpu_quota(hub):
    alice, bob = hub.create_user("alice"), hub.create_user("bob")
    first = hub.gpulab("POST", "/jobs", token=alice, json={**SLEEP, "nproc_per_node": 2})
    assert first.status_code == 201, first.text

    more = hub.gpulab("POST", "/jobs", token=alice, json=SLEEP)
    assert more.status_code == 403
    assert more.json()["error"].startswith(
        "over your CPU quota: your CPU-only jobs and endpoints hold 2 core(s) and this asks "
        "1 more; the quota is 2."
    )
    files = {"spec": (None, '{"name": "cpu", "gpu_milli": 0}'), "model": ("m.tar", b"x")}
    refused = hub.gpulab("POST", "/deployments", token=alice, files=files)
    assert refused.status_code == 403 and "over your CPU quota" in refused.json()["error"]

    # A GPU slice is not CPU-only work; and bob's quota is his own.
    gpu = hub.gpulab("POST", "/jobs", token=alice, json={**SLEEP, "gpu_milli": 250})
    assert gpu.status_code == 201, gpu.text
    assert hub.gpulab("POST", "/jobs", token=bob, json=SLEEP).status_code == 201

    # Cores come back when the job ends.
    assert hub.gpulab("DELETE", f"/jobs/{first.json()['id']}", token=alice).status_code == 200
    deadline = time.monotonic() + 120
    while hub.gpulab("GET", f"/jobs/{first.json()['id']}", token=alice).json()["state"] not in (
        "cancelled",
        "failed",
        "succeeded",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert hub.gpulab("POST", "/jobs", token=alice, json=SLEEP).status_code == 201
