"""One user's waiting jobs are capped (``c.JobQueue.max_queued_jobs_per_user``): every
pass of the queue reads them and each keeps its variables on disk."""

import os

import pytest
from support.service import running_service

from gpulab.db.engine import make_engine
from gpulab.db.jobs import QueueFull
from gpulab.scheduler.queue import JobQueue


def row(job_id: str, user: str) -> dict:
    return {
        "id": job_id,
        "user": user,
        "name": job_id,
        "backend": "local",
        "nodes": 1,
        "nproc_per_node": 1,
        "gpu_milli": 500,
    }


def test_the_cap_counts_one_users_queued_jobs_only(tmp_path):
    q = JobQueue(make_engine(f"sqlite:///{tmp_path}/q.sqlite"))
    q.add(row("a1", "alice"), most_queued=2)
    q.add(row("a2", "alice"), most_queued=2)
    with pytest.raises(QueueFull) as refused:
        q.add(row("a3", "alice"), most_queued=2)
    assert refused.value.args == (2,)
    assert q.get("a3") is None
    q.add(row("b1", "bob"), most_queued=2)  # another user's place is their own
    q.start("a1")  # a running job no longer waits
    q.add(row("a3", "alice"), most_queued=2)
    q.finish("a3", "cancelled")
    q.add(row("a4", "alice"), most_queued=2)
    assert [j["id"] for j in q.list("alice", ("queued",))] == ["a2", "a4"]


@pytest.mark.slow
async def test_a_submit_over_the_cap_is_refused_with_the_fact_and_the_fix(tmp_path):
    config = "c.JobQueue.max_queued_jobs_per_user = 2\n"
    async with running_service(tmp_path / "svc", config, simulate="1xA100-80GB") as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        # carol's server holds the one card: whole-card jobs wait for it.
        svc.create_user("carol")
        svc.fake_hub.users["carol"]["servers"][""] = {"ready": True}
        body = {"user": "carol", "owner_kind": "server", "owner": "carol/", "gpu_milli": 1000}
        r = await svc.request("POST", "/allocations", json=body)
        assert r.status_code == 201, r.text
        job = {"code": "print(1)", "gpu_milli": 1000}
        for _ in range(2):
            r = await svc.request("POST", "/jobs", token=alice, json=job)
            assert r.status_code == 201, r.text
            assert r.json()["state"] == "queued"
        folders = sorted(os.listdir(svc.app.jobs.book.root))

        r = await svc.request("POST", "/jobs", token=alice, json=job)
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert "you have 2 jobs waiting in the queue" in error
        assert "c.JobQueue.max_queued_jobs_per_user" in error
        assert len((await svc.request("GET", "/jobs", token=alice)).json()) == 2
        assert sorted(os.listdir(svc.app.jobs.book.root)) == folders  # nothing left behind
        # At the cap, a body is not even read (its variables may be 256 MiB).
        r = await svc.request("POST", "/jobs", token=alice, json={**job, "timeout": -1})
        assert r.status_code == 429, r.text

        r = await svc.request("POST", "/jobs", token=bob, json=job)
        assert r.status_code == 201, r.text
        first = (await svc.request("GET", "/jobs", token=alice)).json()[0]["id"]
        r = await svc.request("DELETE", f"/jobs/{first}", token=alice)
        assert r.status_code in (200, 202, 204), r.text
        r = await svc.request("POST", "/jobs", token=alice, json=job)
        assert r.status_code == 201, r.text
        jobs = (await svc.request("GET", "/jobs", token=alice)).json()
        assert [j["state"] for j in jobs] == ["cancelled", "queued", "queued"]


@pytest.mark.slow
async def test_an_ended_jobs_variables_leave_the_disk(tmp_path):
    """Each job's variables (up to max_job_vars_mib) are the service's file, under no
    user's disk quota: submitting and cancelling in a loop filled the disk."""
    import base64

    import cloudpickle

    async with running_service(tmp_path / "svc", "", simulate="1xA100-80GB") as svc:
        alice = svc.create_user("alice")
        svc.create_user("carol")  # carol's server holds the card: the job waits
        svc.fake_hub.users["carol"]["servers"][""] = {"ready": True}
        body = {"user": "carol", "owner_kind": "server", "owner": "carol/", "gpu_milli": 1000}
        assert (await svc.request("POST", "/allocations", json=body)).status_code == 201
        shipped = base64.b64encode(cloudpickle.dumps({"x": list(range(1000))})).decode()
        job = {"code": "print(len(x))", "gpu_milli": 1000, "vars_b64": shipped}
        r = await svc.request("POST", "/jobs", token=alice, json=job)
        assert r.status_code == 201, r.text
        variables = os.path.join(svc.app.jobs.book.root, r.json()["id"], "vars.pkl")
        assert os.path.getsize(variables) > 1000  # kept while it may still run

        r = await svc.request("DELETE", f"/jobs/{r.json()['id']}", token=alice)
        assert r.status_code in (200, 202, 204), r.text
        assert r.json()["state"] == "cancelled"
        assert not os.path.exists(variables)
