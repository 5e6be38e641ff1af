"""Limits that hold the host, on a real hub: a user's CPU and memory quota (held
by the kernel, checked at submit), processes per job node, logs under their cap.

``c.HostQuota.user_cpu_quota = 2`` (cores), one core per CPU-only rank and
``cpu_overcommit = 1.5`` (so one job may ask 3); a 5 GiB memory quota; logs of
1 MiB. Jobs run as real accounts in real cgroups (v1 here), read back from the
cgroup filesystem.
"""

import glob
import os

import pytest
from hubproc import RunningHub
from support.wait import wait_until

pytestmark = pytest.mark.slow
SLEEP = {"code": "import time\ntime.sleep(600)", "name": "sleeper"}
GIB = 2**30


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(
        tmp_path_factory.mktemp("cpuquota"),
        simulate="1xA100-80GB",
        config=(
            "c.HostQuota.user_cpu_quota = 2\n"
            "c.HostQuota.cpu_overcommit = 1.5\n"
            "c.HostQuota.user_memory_quota = 5 * 2**30\n"
            "c.AccountLimits.cpu_floor = 1\n"
            "c.AccountLimits.memory_floor = 2**30\n"
            "c.AccountLimits.memory_per_gpu = 8 * 2**30\n"
            "c.GpuLabService.job_log_max_bytes = 2**20\n"
        ),
    )
    yield h
    for job in h.gpulab("GET", "/jobs").json():
        h.gpulab("DELETE", f"/jobs/{job['id']}")
    h.stop()


def _node_dir(controller: str, job_id: str) -> str | None:
    found = glob.glob(f"/sys/fs/cgroup/{controller}/**/job-{job_id}-node0", recursive=True)
    return found[0] if found else None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def test_a_job_asks_no_more_than_the_quota_and_a_job_that_cannot_fit_is_refused(hub):
    alice, bob = hub.create_user("alice"), hub.create_user("bob")
    first = hub.gpulab("POST", "/jobs", token=alice, json={**SLEEP, "nproc_per_node": 3})
    assert first.status_code == 201, first.text
    # CPU time is shared: a second job is accepted, and the two share the quota.
    second = hub.gpulab("POST", "/jobs", token=alice, json=SLEEP)
    assert second.status_code == 201, second.text

    too_many = hub.gpulab("POST", "/jobs", token=alice, json={**SLEEP, "nproc_per_node": 4})
    assert too_many.status_code == 403
    assert too_many.json()["error"] == (
        "4 ranks need 4 CPUs; your quota is 2 (up to 3 shared): use fewer ranks or ask "
        "an admin to raise c.HostQuota.user_cpu_quota"
    )
    # A 1/4 slice's rank asks a quarter of 8 GiB; three of them are over 5 GiB.
    memory = hub.gpulab(
        "POST", "/jobs", token=alice, json={**SLEEP, "nproc_per_node": 3, "gpu_milli": 250}
    )
    assert memory.status_code == 403
    assert memory.json()["error"] == (
        "3 ranks need 6 GiB of memory (2 GiB each); your quota is 5 GiB: use fewer ranks "
        "or ask an admin to raise c.HostQuota.user_memory_quota"
    )
    files = {"spec": (None, '{"name": "cpu", "gpu_milli": 0, "replicas": 4}'), "model": ("m", b"x")}
    refused = hub.gpulab("POST", "/deployments", token=alice, files=files)
    assert refused.status_code == 403 and "4 replicas need 4 CPUs" in refused.json()["error"]
    assert hub.gpulab("POST", "/jobs", token=bob, json=SLEEP).status_code == 201

    if os.geteuid() != 0:
        pytest.skip("the cgroups are made only as root")
    job_id = first.json()["id"]

    def held() -> str | None:
        # The group is made, its limits written, then the node's agent started in it:
        # once a process is in it, every limit has been written.
        found = _node_dir("cpu", job_id)
        return found if found and _read(os.path.join(found, "cgroup.procs")) else None

    cpu = wait_until(
        held,
        f"job {job_id}'s node cgroup with its agent in it",
        detail=lambda: str(hub.gpulab("GET", f"/jobs/{job_id}", token=alice).json()),
    )
    # Three ranks at a core each would ask 3 cores: the node gets the quota's 2.
    assert _read(os.path.join(cpu, "cpu.cfs_quota_us")) == "200000"
    memory_dir = _node_dir("memory", job_id)
    assert int(_read(os.path.join(memory_dir, "memory.limit_in_bytes"))) == 3 * GIB
    # Alice's groups together: the account's cgroup holds her quota.
    assert _read(os.path.join(os.path.dirname(cpu), "cpu.cfs_quota_us")) == "200000"
    account_memory = os.path.join(os.path.dirname(memory_dir), "memory.limit_in_bytes")
    assert int(_read(account_memory)) == 5 * GIB
    # And a process cap, so a fork bomb in the job stops there.
    assert _read(os.path.join(_node_dir("pids", job_id), "pids.max")) == "4096"
    for job in (first, second):
        hub.gpulab("DELETE", f"/jobs/{job.json()['id']}", token=alice)


def test_a_job_that_prints_too_much_keeps_its_newest_lines(hub):
    carol = hub.create_user("carol")
    code = "for i in range(300_000):\n    print(f'line {i:07d}')\nprint('the end')"
    r = hub.gpulab("POST", "/jobs", token=carol, json={"code": code, "name": "chatty"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def ended():
        job = hub.gpulab("GET", f"/jobs/{job_id}", token=carol).json()
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    job = wait_until(ended, f"job {job_id} to end")
    assert job["state"] == "succeeded", job
    # 3.6 MiB printed into a 1 MiB log: the newest lines, and the log says what went.
    tail = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=carol, params={"rank": 0}).text
    lines = tail.splitlines()
    assert lines[0].startswith("[r0] [gpulab] log over 1 MiB: older lines dropped (")
    assert lines[-2:] == ["[r0] line 0299999", "[r0] the end"]
    # The log itself (the API's "[r0] " before each line is not in it) is under the cap.
    kept = sum(len(line.removeprefix("[r0] ")) + 1 for line in lines)
    assert kept <= 2**20, kept
