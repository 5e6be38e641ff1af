"""The job API against a real hub: submit, run, logs, metrics, out, cancel, queue, quota."""

import glob
import json
import os

import cloudpickle
import pytest
import torch
from cells import FAILS_ON_RANK_1, LINEAR, SLEEPS
from hubproc import fresh_user
from jobhelpers import pid_alive, submit, wait_job
from support.group_limits import limited_user
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE, BOB, CAPPED = fresh_user("alice"), fresh_user("bob"), fresh_user("capped")


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub; no job of this module is left running behind it."""
    return plain_hub


@pytest.fixture(scope="module")
def alice(hub):
    return hub.create_user(ALICE)


@pytest.fixture(scope="module")
def capped(hub):
    """A user whose quota (a hub group's, this module's own) is half a GPU."""
    token = hub.create_user(CAPPED)
    with limited_user(hub, CAPPED, quota_milli=500) as group:
        yield token, group


@pytest.fixture(scope="module")
def bob(hub):
    return hub.create_user(BOB)


def job_dir(hub, job_id):
    return hub.data_dir / "jobs" / job_id


def test_two_rank_job_trains_reports_and_returns_out(hub, alice):
    r = submit(
        hub,
        alice,
        LINEAR,
        nproc_per_node=2,
        gpu_milli=500,
        out="model",
        checkpoint_every=10,
        env={"STEPS": "30"},
        name="linear",
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] in ("queued", "running") and job["world_size"] == 2
    running = wait_job(hub, alice, job["id"], states=("running", "succeeded"))
    if running["state"] == "running":
        # While it runs, each rank holds its slice under its own ledger owner.
        owners = {
            a["owner"]: a["milli"]
            for a in hub.gpulab("GET", "/allocations", token=alice).json()
            if a["owner_kind"] == "job"
        }
        assert owners in ({}, {f"{job['id']}/0": 500, f"{job['id']}/1": 500})
    done = wait_job(hub, alice, job["id"])
    assert done["state"] == "succeeded", done
    assert done["has_out"] and done["finished"]
    # Its slices are released.
    assert [
        a for a in hub.gpulab("GET", "/allocations", token=alice).json() if a["owner_kind"] == "job"
    ] == []

    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice).text
    assert "[r0] rank 0/2 done" in logs and "[r1] rank 1/2 done" in logs
    assert "[gpulab] job started: 2 ranks on GPU" in logs
    only_r1 = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice, params={"rank": 1}).text
    assert "[r1]" in only_r1 and "[r0]" not in only_r1
    # The last lines only (what the lab's panel shows), and a clear 400 for a bad count.
    every = logs.splitlines()
    for n in (1, 3):
        last = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice, params={"tail": n})
        assert last.text.splitlines() == every[-n:]
    assert (
        hub.gpulab(
            "GET", f"/jobs/{job['id']}/logs", token=alice, params={"tail": 100_000}
        ).text.splitlines()
        == every
    )
    for bad in ("0", "-2", "x", "1e3", "²", "9" * 5000, "100001"):
        r = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice, params={"tail": bad})
        assert r.status_code == 400 and "tail must be a number of lines" in r.text, (bad, r.text)

    m = hub.gpulab("GET", f"/jobs/{job['id']}/metrics", token=alice).json()
    losses = [rec["loss"] for rec in m["records"]]
    assert len(losses) == 30 and m["records"][-1]["total_steps"] == 30
    assert sum(losses[-5:]) < 0.2 * sum(losses[:5])  # it learns
    # Incremental reads: from the returned cursor there is nothing new.
    again = hub.gpulab(
        "GET", f"/jobs/{job['id']}/metrics", token=alice, params={"cursor": m["cursor"]}
    ).json()
    assert again["records"] == [] and again["cursor"] == m["cursor"]

    out = hub.gpulab("GET", f"/jobs/{job['id']}/out", token=alice)
    assert out.headers["Content-Type"] == "application/octet-stream"
    model = cloudpickle.loads(out.content)
    saved = torch.load(job_dir(hub, job["id"]) / "out" / "state_dict.pt")
    assert isinstance(model, torch.nn.Linear)
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k])
    # The checkpoints it wrote (every 10 steps, the last two kept).
    assert (
        json.loads((job_dir(hub, job["id"]) / "checkpoints" / "latest").read_text())["step"] == 30
    )


def test_follow_streams_until_the_job_ends(hub, alice):
    job = submit(hub, alice, LINEAR, nproc_per_node=2, env={"STEPS": "20"}).json()
    import requests

    with requests.get(
        f"{hub.api}/jobs/{job['id']}/logs",
        params={"follow": "1"},
        headers=hub.auth(alice),
        stream=True,
        timeout=300,
    ) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines(decode_unicode=True)]
    # The stream ended by itself, after the ranks' last lines and the job's end.
    assert any(ln.startswith("[r1] rank 1/2 done") for ln in lines)
    assert lines[-1].startswith("[gpulab] job succeeded") or any(
        "job succeeded" in ln for ln in lines
    )
    assert not any("succeeded: succeeded" in ln for ln in lines), lines  # the state once
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=alice).json()["state"] == "succeeded"


def test_failing_rank_is_named_with_its_traceback(hub, alice):
    job = submit(hub, alice, FAILS_ON_RANK_1, nproc_per_node=2).json()
    done = wait_job(hub, alice, job["id"])
    assert done["state"] == "failed"
    assert done["error"]["rank"] == 1
    assert "rank 1 failed: ValueError: bad batch shape on purpose" in done["message"]
    assert "cell.py" in done["error"]["traceback"]
    assert "raise ValueError" in done["error"]["traceback"]
    # The root cause is torchrun's own error file, which the rank wrote.
    error_file = done["error"]["error_file"]
    assert error_file and json.load(open(error_file))["message"]["message"].startswith(
        "ValueError: bad batch shape"
    )
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice).text
    assert "[r1] ValueError: bad batch shape on purpose" in logs


def test_other_users_cannot_see_read_or_cancel(hub, alice, bob):
    job = submit(hub, alice, SLEEPS).json()
    wait_job(hub, alice, job["id"], states=("running",))
    for method, path in [
        ("GET", ""),
        ("GET", "/logs"),
        ("GET", "/metrics"),
        ("GET", "/out"),
        ("DELETE", ""),
    ]:
        r = hub.gpulab(method, f"/jobs/{job['id']}{path}", token=bob)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"] == f"no job {job['id']!r}"
    assert hub.gpulab("GET", "/jobs", token=bob).json() == []
    assert hub.gpulab("GET", "/jobs", token=bob, params={"user": ALICE}).status_code == 403
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=alice).json()["state"] == "running"
    # The admin sees it, and alice cancels it: every process is gone, slices released.
    assert job["id"] in {j["id"] for j in hub.gpulab("GET", "/jobs").json()}
    pids = [
        json.load(open(p))["pid"] for p in glob.glob(str(job_dir(hub, job["id"]) / "pids" / "*"))
    ]
    launch = json.load(open(job_dir(hub, job["id"]) / "launch.json"))
    pids += [n["pid"] for n in launch["nodes"]]
    r = hub.gpulab("DELETE", f"/jobs/{job['id']}", token=alice)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert r.json()["message"] == "cancelled by its owner"
    assert not [p for p in pids if pid_alive(p)]


def test_over_quota_is_refused_with_the_reason_and_nothing_starts(hub, capped):
    capped, group = capped
    r = submit(hub, capped, LINEAR, nproc_per_node=2, gpu_milli=500)
    assert r.status_code == 403
    assert (
        f"over the quota of group {group!r}: the job needs 1 GPU in all and the group's "
        "quota is 1/2 GPU" in r.json()["error"]
    )
    assert hub.gpulab("GET", "/jobs", token=capped).json() == []
    assert hub.gpulab("GET", "/allocations", token=capped).json() == []


def test_a_full_cluster_queues_jobs_in_priority_order(hub, alice):
    blocker = submit(hub, alice, SLEEPS, nproc_per_node=2, gpu_milli=1000).json()
    wait_job(hub, alice, blocker["id"], states=("running",))
    first = submit(hub, alice, LINEAR, gpu_milli=500, env={"STEPS": "3"}).json()
    low = submit(hub, alice, LINEAR, gpu_milli=500, env={"STEPS": "3"}, priority=-5).json()
    second = submit(hub, alice, LINEAR, gpu_milli=500, env={"STEPS": "3"}).json()

    def head_waits():  # the queue loop has tried the head of the queue: it has no room
        job = hub.gpulab("GET", f"/jobs/{first['id']}", token=alice).json()
        return "waiting for free GPUs" in job["message"]

    wait_until(head_waits, "the queue loop to try the first queued job", 60)
    states = {j["id"]: j for j in hub.gpulab("GET", "/jobs", token=alice).json()}
    assert [states[j["id"]]["position"] for j in (first, second, low)] == [1, 2, 3]
    assert all(states[j["id"]]["state"] == "queued" for j in (first, second, low))
    assert "waiting for free GPUs" in states[first["id"]]["message"]
    # No queued job holds anything (all-or-nothing).
    held = {a["owner"].split("/")[0] for a in hub.gpulab("GET", "/allocations").json()}
    assert held == {blocker["id"]}
    hub.gpulab("DELETE", f"/jobs/{blocker['id']}", token=alice)
    for j in (first, second, low):
        assert wait_job(hub, alice, j["id"])["state"] == "succeeded"
    started = [
        hub.gpulab("GET", f"/jobs/{j['id']}", token=alice).json()["started"]
        for j in (first, second, low)
    ]
    assert started[2] >= started[0] and started[2] >= started[1]


@pytest.mark.parametrize(
    "fields, status, message",
    [
        ({"gpu_milli": 300}, 400, "3/10 GPU is not a slice size offered here"),
        ({"nodes": 0}, 400, "'nodes' must be an integer from 1"),
        ({"gpus": 1}, 400, "unknown field: gpus"),
        ({"user": "bob"}, 400, "set by the service"),
        ({"backend": "kubernetes"}, 400, "no pool runs the kubernetes backend here"),
        ({"pool": "cloud"}, 400, "no pool 'cloud' here; this site's pools: local"),
        ({"comm_hook": "bf16", "nproc_per_node": 2}, 400, "bf16 needs NCCL"),
        ({"amp": "fp8"}, 400, "'amp' must be bf16 or fp16"),
        ({"priority": 5}, 403, "raising it is for admins"),
        ({"gpu_milli": 1000, "nproc_per_node": 3}, 409, "the cluster has 2 GPUs"),
        ({"env": {"RANK": "3"}}, 400, "set by gpulab for every rank"),
    ],
)
def test_bad_submissions_are_refused_and_leave_nothing(hub, alice, fields, status, message):
    # The ids, not the rows: a job of an earlier test may finish meanwhile.
    before = {j["id"] for j in hub.gpulab("GET", "/jobs", token=alice).json()}
    r = submit(hub, alice, LINEAR, **fields)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert {j["id"] for j in hub.gpulab("GET", "/jobs", token=alice).json()} == before


def test_jobs_are_in_the_openapi_document(hub):
    paths = hub.gpulab("GET", "/openapi.json").json()["paths"]
    for p in (
        "/api/v1/jobs",
        "/api/v1/jobs/{id}",
        "/api/v1/jobs/{id}/logs",
        "/api/v1/jobs/{id}/metrics",
        "/api/v1/jobs/{id}/out",
    ):
        assert p in paths


def test_a_killed_rank_restarts_the_job_and_the_job_says_so(hub, alice):
    import signal

    job = submit(
        hub,
        alice,
        LINEAR,
        nproc_per_node=2,
        max_restarts=1,
        checkpoint_every=10,
        env={"STEPS": "40", "STEP_DELAY": "0.15"},
    ).json()
    jd = job_dir(hub, job["id"])
    wait_until(
        lambda: (jd / "checkpoints" / "latest").exists(), "a checkpoint written", 300, every=0.1
    )
    os.kill(json.load(open(jd / "pids" / "rank1.json"))["pid"], signal.SIGKILL)
    done = wait_job(hub, alice, job["id"])
    assert done["state"] == "succeeded" and done["restarts"] == 1, done
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=alice).text
    assert (
        "[gpulab] restart 1: a rank stopped; every rank restarted from checkpoint at step" in logs
    )
    assert "[r1] --- restart 1 ---" in logs


def test_running_jobs_show_on_the_dashboard_feed(hub, alice, bob):
    """The telemetry answer carries the caller's running jobs with their progress."""
    job = submit(hub, alice, SLEEPS, nproc_per_node=1, gpu_milli=100, name="feed").json()
    try:

        def shown():
            jobs = hub.gpulab("GET", "/telemetry", token=alice).json()["jobs"]
            mine = [j for j in jobs if j["id"] == job["id"]]
            return mine if mine and mine[0].get("step", 0) >= 2 else None

        mine = wait_until(shown, f"job {job['id']} at step 2 on the dashboard feed", 240)
        assert mine and mine[0]["name"] == "feed" and mine[0]["state"] == "running"
        assert mine[0]["step"] >= 2
        # Another user's feed does not list it; the admin's does.
        assert job["id"] not in {
            j["id"] for j in hub.gpulab("GET", "/telemetry", token=bob).json()["jobs"]
        }
        assert job["id"] in {j["id"] for j in hub.gpulab("GET", "/telemetry").json()["jobs"]}
    finally:
        hub.gpulab("DELETE", f"/jobs/{job['id']}", token=alice)
