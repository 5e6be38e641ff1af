"""kill -9 the gpulab service while jobs run: the hub restarts it, and the new
service re-attaches: running jobs keep their processes, finish and are recorded;
a job can still be cancelled; slices are released exactly once.
"""

import glob
import json
import os
import signal

import pytest
from cells import LINEAR, SLEEPS
from hubproc import RunningHub
from jobhelpers import pid_alive, submit, wait_job, wait_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def hub(tmp_path):
    h = RunningHub(tmp_path / "hub", simulate="2xA100-80GB")
    yield h
    for job in h.gpulab("GET", "/jobs", params={"state": "running"}).json():
        h.gpulab("DELETE", f"/jobs/{job['id']}")
    h.stop()


def rank_pids(hub, job_id):
    return [
        json.load(open(p))["pid"]
        for p in glob.glob(str(hub.data_dir / "jobs" / job_id / "pids" / "rank*.json"))
    ]


def test_running_jobs_survive_a_service_restart(hub):
    alice = hub.create_user("alice")
    gate = hub.data_dir / "go"
    finishing = submit(
        hub, alice, LINEAR, nproc_per_node=2, gpu_milli=500, env={"STEPS": "30", "GATE": str(gate)}
    ).json()
    sleeping = submit(hub, alice, SLEEPS, gpu_milli=500).json()
    wait_metrics(hub, alice, finishing["id"], 5)  # now held at step 5 until the gate opens
    wait_metrics(hub, alice, sleeping["id"], 1)
    before = {j: rank_pids(hub, j) for j in (finishing["id"], sleeping["id"])}
    held = hub.gpulab("GET", "/allocations").json()
    assert len(held) == 3

    pid = hub.service_pid()
    os.kill(pid, signal.SIGKILL)
    hub.wait_service_restarted(pid)

    # The same rank processes run on; the new service reports them as running.
    for job_id, pids in before.items():
        assert all(pid_alive(p) for p in pids), job_id
        assert hub.gpulab("GET", f"/jobs/{job_id}", token=alice).json()["state"] == "running"
    assert hub.gpulab("GET", "/allocations").json() == held

    gate.touch()
    done = wait_job(hub, alice, finishing["id"])
    assert done["state"] == "succeeded", done
    logs = hub.gpulab("GET", f"/jobs/{finishing['id']}/logs", token=alice).text
    assert "[r0] rank 0/2 done" in logs and "[r1] rank 1/2 done" in logs
    records = hub.gpulab("GET", f"/jobs/{finishing['id']}/metrics", token=alice).json()["records"]
    assert [r["step"] for r in records] == list(range(30))

    r = hub.gpulab("DELETE", f"/jobs/{sleeping['id']}", token=alice)
    assert r.json()["state"] == "cancelled"
    assert not any(pid_alive(p) for p in before[sleeping["id"]])
    assert hub.gpulab("GET", "/allocations").json() == []
