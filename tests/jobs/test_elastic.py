"""Elastic jobs (``--nodes MIN:MAX``) on a real hub with two simulated GPUs.

A 1:2 job runs on both GPUs; a user's server takes one back and the job shrinks
to one node at a step boundary (never queued), grows back when the server stops,
and ends with the weights of an uninterrupted one-node run: each step sees the
same global batch at any size (float64, so only the order of additions differs,
about 1e-16 per operation: we allow 1e-9). A rank killed makes the job go on at
the smaller size, then grow again.
"""

import json
import os
import signal

import pytest
import torch
from cells import ELASTIC
from hubproc import fresh_user
from jobhelpers import submit, wait_job, wait_metrics
from support.wait import wait_until

pytestmark = pytest.mark.slow

ELASTIC_1_2 = {"min_nodes": 1, "max_nodes": 2, "nodes": 2, "gpu_milli": 1000}
STEPS = 60


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def job(hub, token, job_id) -> dict:
    return hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()


def weights(hub, token, job_id) -> dict:
    import cloudpickle

    out = hub.gpulab("GET", f"/jobs/{job_id}/out", token=token)
    assert out.status_code == 200, out.text
    return cloudpickle.loads(out.content).state_dict()


def wait_nodes(hub, token, job_id, nodes: int, timeout: float = 120, after: int = 0) -> dict:
    """The job running on ``nodes`` nodes, its ranks past their first step there
    (and past ``after`` resizes)."""

    def there():
        j = job(hub, token, job_id)
        if j["state"] == "queued" and not j["started"] and not j["preemptions"]:
            return None  # not started yet
        if j["state"] != "running":  # never queued again, never ended on the way
            logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
            m = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=token).json()["records"]
            raise AssertionError(f"{j}\n{m[-3:]}\n{logs[-4000:]}")
        if j["nodes_running"] != nodes or j["resizing"] or len(j["resizes"]) < after:
            return None
        m = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=token).json()["records"]
        return j if m and m[-1].get("world_size") == nodes else None

    return wait_until(there, f"job {job_id} on {nodes} nodes", timeout, detail=hub.log_tail)


def test_an_elastic_job_shrinks_for_a_server_and_grows_back_to_the_same_weights(hub):
    bob, alice = fresh_user("bob"), fresh_user("alice")
    bob_token, alice_token = hub.create_user(bob), hub.create_user(alice)

    # What an uninterrupted run on one node ends with.
    ref = submit(hub, bob_token, ELASTIC, env={"STEPS": str(STEPS)}, out="model", name="ref")
    done = wait_job(hub, bob_token, ref.json()["id"])
    assert done["state"] == "succeeded", done
    expected = weights(hub, bob_token, done["id"])

    slow = {"STEPS": str(STEPS), "STEP_DELAY": "0.25"}
    r = submit(hub, bob_token, ELASTIC, env=slow, out="model", name="elastic", **ELASTIC_1_2)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert r.json()["elastic"] and (r.json()["min_nodes"], r.json()["max_nodes"]) == (1, 2)
    on_both = wait_nodes(hub, bob_token, job_id, 2)
    assert on_both["resizes"] == []  # both GPUs were free: it started on both

    r = hub.spawn(alice, {"gpu_milli": 500}, token=alice_token)
    assert r.status_code in (201, 202), r.text
    hub.wait_server(alice)
    shrunk = wait_nodes(hub, bob_token, job_id, 1)
    assert shrunk["preemptions"] == 0  # shrunk, not stopped and queued
    last = shrunk["resizes"][-1]
    assert last["nodes"] == 1 and last["reason"] == "an interactive server needed a GPU", last
    held = {(a["owner_kind"], a["owner"]) for a in hub.gpulab("GET", "/allocations").json()}
    assert ("job", f"{job_id}/0") in held and ("job", f"{job_id}/1") not in held, held

    hub.hub_api("DELETE", f"/users/{alice}/server")
    hub.wait_server(alice, ready=False)
    grown = wait_nodes(hub, bob_token, job_id, 2)
    assert [r["nodes"] for r in grown["resizes"]] == [1, 2]
    assert grown["resizes"][-1]["reason"] == "slices freed"

    done = wait_job(hub, bob_token, job_id)
    assert done["state"] == "succeeded" and done["preemptions"] == 0, done
    logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=bob_token).text
    for resize in done["resizes"]:
        verb = "shrank" if resize["nodes"] == 1 else "grew"
        assert f"[gpulab] {verb} to {resize['nodes']} node" in logs, logs[-3000:]
        assert f"at step {resize['step']}" in logs

    # The loss curve goes on across the resizes: every step once, in order, and the
    # world size of each step says where the job was.
    records = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=bob_token).json()["records"]
    assert [r["step"] for r in records] == list(range(STEPS))
    sizes = [r["world_size"] for r in records]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2
    # Fair share counts what it grew into: the two slices it started with and the one
    # it grew back into (the reference ran on CPU).
    usage = hub.gpulab("GET", f"/usage?group_by=user&user={bob}", token=bob_token).json()
    assert [r["allocations"] for r in usage["rows"]] == [3], usage
    got = weights(hub, bob_token, job_id)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-9, atol=1e-9)


def test_a_killed_rank_leaves_the_job_smaller_then_it_grows_back(hub):
    bob = fresh_user("bob")
    token = hub.create_user(bob)
    slow = {"STEPS": "40", "STEP_DELAY": "0.3"}
    r = submit(hub, token, ELASTIC, env=slow, max_restarts=1, checkpoint_every=5, **ELASTIC_1_2)
    job_id = r.json()["id"]
    wait_nodes(hub, token, job_id, 2)
    wait_metrics(hub, token, job_id, 8)  # past the first checkpoint

    pids = hub.data_dir / "jobs" / job_id / "pids"
    rank1 = json.loads((pids / "rank1.json").read_text())["pid"]
    os.kill(rank1, signal.SIGKILL)

    grown = wait_nodes(hub, token, job_id, 2, after=2)
    assert [r["nodes"] for r in grown["resizes"]] == [1, 2], grown["resizes"]
    assert grown["resizes"][0]["reason"].startswith("rank 1 failed"), grown["resizes"]
    assert grown["restarts"] == 1, grown
    done = wait_job(hub, token, job_id)
    assert done["state"] == "succeeded", done
    # It trained at one node in between (records of world size 1), and went on from
    # the checkpoint before the failure: no step is missing.
    records = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=token).json()["records"]
    assert 1 in {r["world_size"] for r in records}
    assert sorted({r["step"] for r in records}) == list(range(40))
