"""Priority classes and preemption on a real hub with two simulated GPUs.

Batch jobs fill every gap and yield: a server, an endpoint or a user within
their guarantee takes the room back; the preempted job saves a checkpoint at its
next step, waits in the queue, resumes from there and ends with exactly the
weights of a run that was never interrupted.
"""

import json

import pytest
import torch
from cells import LINEAR, SLEEPS
from hubproc import fresh_user
from jobhelpers import submit, wait_job, wait_metrics
from support.group_limits import limited_user
from support.wait import wait_until

pytestmark = pytest.mark.slow

GUARANTEED = fresh_user("guaranteed")  # 1000 milli guaranteed: the `guaranteed` fixture
CAPPED = fresh_user("capped")  # a 500 milli limit: the `capped` fixture
BOTH_GPUS = {"nproc_per_node": 2, "gpu_milli": 1000}
TRAIN = {"checkpoint_every": 10, "out": "model", **BOTH_GPUS}


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


@pytest.fixture(scope="module")
def guaranteed(hub):
    """A token of a user who gets a whole GPU back by preemption (a hub group's
    guarantee, this module's own)."""
    token = hub.create_user(GUARANTEED)
    with limited_user(hub, GUARANTEED, guaranteed_milli=1000):
        yield token


@pytest.fixture(scope="module")
def capped(hub):
    """A user whose limit (a hub group's, this module's own) is half a GPU: the group."""
    hub.create_user(CAPPED)
    with limited_user(hub, CAPPED, quota_milli=500) as group:
        yield group


def weights(hub, token, job_id) -> dict:
    out = hub.gpulab("GET", f"/jobs/{job_id}/out", token=token)
    assert out.status_code == 200, out.text
    import cloudpickle

    return cloudpickle.loads(out.content).state_dict()


def job(hub, token, job_id) -> dict:
    return hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()


def test_a_server_preempts_a_batch_job_which_resumes_to_the_same_weights(hub):
    bob, alice = fresh_user("bob"), fresh_user("alice")
    bob_token, alice_token = hub.create_user(bob), hub.create_user(alice)

    # What an uninterrupted run ends with.
    ref = submit(hub, bob_token, LINEAR, env={"STEPS": "60"}, name="ref", **TRAIN).json()
    done = wait_job(hub, bob_token, ref["id"])
    assert done["state"] == "succeeded", done
    expected = weights(hub, bob_token, ref["id"])

    # The same job again, slowed down until it is preempted (14 s left after step 12,
    # for the spawn to reach the queue on a loaded machine); it holds both GPUs.
    slow = {"STEPS": "60", "STEP_DELAY": "0.3", "FAST_ONCE_RESUMED": "1"}
    run = submit(hub, bob_token, LINEAR, env=slow, name="long", **TRAIN).json()
    wait_metrics(hub, bob_token, run["id"], 12)  # past its first checkpoint (step 10)

    r = hub.spawn(alice, {"gpu_milli": 500}, token=alice_token)
    assert r.status_code in (201, 202), r.text
    hub.wait_server(alice)
    env = hub.server_env(alice)
    assert env["GPULAB_GPU_MILLI"] == "500"

    requeued = job(hub, bob_token, run["id"])
    assert requeued["state"] == "queued" and requeued["preemptions"] == 1, requeued
    assert requeued["message"].startswith("preempted for an interactive server"), requeued
    jd = hub.data_dir / "jobs" / run["id"]
    stopped_at = json.loads((jd / "checkpoints" / "latest").read_text())["step"]
    assert 12 <= stopped_at < 60  # the checkpoint of the preemption, not the periodic one
    assert f"resumes from its checkpoint at step {stopped_at}" in requeued["message"]
    # Alice's slice is held by her server; bob's ranks hold nothing while queued.
    held = hub.gpulab("GET", "/allocations").json()
    assert {(a["owner_kind"], a["user"]) for a in held} == {("server", alice)}

    hub.hub_api("DELETE", f"/users/{alice}/server")
    hub.wait_server(alice, ready=False)
    done = wait_job(hub, bob_token, run["id"])
    assert done["state"] == "succeeded" and done["preemptions"] == 1, done
    logs = hub.gpulab("GET", f"/jobs/{run['id']}/logs", token=bob_token).text
    assert f"[gpulab] preempted: saved a checkpoint at step {stopped_at}" in logs
    assert f"[gpulab] resumed from the checkpoint at step {stopped_at}" in logs
    got = weights(hub, bob_token, run["id"])
    assert got.keys() == expected.keys()
    for k in expected:
        assert torch.equal(got[k], expected[k]), k  # bit for bit


def test_a_no_preempt_job_is_never_chosen(hub):
    bob, alice = fresh_user("bob"), fresh_user("alice")
    bob_token, alice_token = hub.create_user(bob), hub.create_user(alice)
    kept = submit(hub, bob_token, SLEEPS, preemptible=False, **BOTH_GPUS).json()
    wait_metrics(hub, bob_token, kept["id"], 2)
    r = hub.spawn(alice, {"gpu_milli": 500}, token=alice_token)
    assert r.status_code >= 400 and "no GPU has room" in r.text, r.text  # nothing to free
    after = job(hub, bob_token, kept["id"])
    assert after["state"] == "running" and after["preemptions"] == 0 and not after["preempting"]
    hub.gpulab("DELETE", f"/jobs/{kept['id']}", token=bob_token)


def test_a_serving_replica_preempts_batch(hub, tmp_path):
    from gpulab.client import Client
    from gpulab.serving.export import export_model

    bob, carol = fresh_user("bob"), fresh_user("carol")
    bob_token, carol_token = hub.create_user(bob), hub.create_user(carol)
    batch = submit(hub, bob_token, SLEEPS, **BOTH_GPUS).json()
    wait_metrics(hub, bob_token, batch["id"], 2)

    model = torch.nn.Linear(4, 2)
    export_model(model.eval(), torch.randn(2, 4), str(tmp_path), name="m", max_batch_size=4)
    dep = Client(hub.api, token=carol_token).create_deployment(
        str(tmp_path), {"name": "urgent", "gpu_milli": 250}
    )
    assert dep["state"] == "starting" and dep["message"].startswith("freeing a slice"), dep

    def running():
        d = hub.gpulab("GET", "/deployments/urgent", token=carol_token).json()
        return d if d["state"] == "running" and d["replicas_ready"] == 1 else None

    wait_until(running, "the endpoint running", 240, detail=hub.log_tail)
    requeued = job(hub, bob_token, batch["id"])
    assert requeued["state"] in ("queued", "running") and requeued["preemptions"] == 1
    assert "preempted for a serving endpoint" in requeued["message"] or requeued["started"]
    hub.gpulab("DELETE", "/deployments/urgent", token=carol_token)
    hub.gpulab("DELETE", f"/jobs/{batch['id']}", token=bob_token)


def test_a_user_within_her_guarantee_reclaims_from_a_borrower(hub, guaranteed):
    dave = fresh_user("dave")
    dave_token, mine = hub.create_user(dave), guaranteed
    borrowed = submit(hub, dave_token, SLEEPS, **BOTH_GPUS).json()
    wait_metrics(hub, dave_token, borrowed["id"], 2)

    # Same class (batch): only her guarantee lets her take the GPU back.
    reclaim = submit(hub, mine, SLEEPS, gpu_milli=1000).json()
    wait_job(hub, mine, reclaim["id"], states=("running",))
    lost = job(hub, dave_token, borrowed["id"])
    assert lost["preemptions"] == 1 and lost["state"] == "queued", lost
    assert "preempted for a batch job" in lost["message"]

    # Borrowing the other GPU is allowed; the borrower's job waits for both.
    for j, token in ((reclaim, mine), (borrowed, dave_token)):
        hub.gpulab("DELETE", f"/jobs/{j['id']}", token=token)


def test_a_request_over_the_limit_is_refused_with_the_reason(hub, capped):
    r = hub.gpulab(
        "POST",
        "/allocations",
        json={"user": CAPPED, "owner_kind": "server", "owner": f"{CAPPED}/", "gpu_milli": 1000},
    )
    assert r.status_code == 403
    assert r.json()["error"].startswith(
        f"over the quota of group {capped!r}: its members hold no GPU of 1/2 GPU"
    )
