"""An endpoint version's lineage on the real service (in-process, a stand-in hub API).

The deploy spec names the job; the service takes the job's code hash and datasets
from its own record, refuses a job that is not the caller's, and shows the lineage
to exactly those who may call the endpoint (``GET /models/{owner}/{name}/lineage``),
refusing the others as a call would. The audit entry names the job and code hash.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from support.service import running_service

from gpulab.client.deployments import pack_model_dir
from gpulab.serving.export import export_model

CODE = "import time; time.sleep(60)"


@pytest.fixture(scope="module")
def model_tar(tmp_path_factory) -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    path = tmp_path_factory.mktemp("lineage-model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="m", max_batch_size=4)
    return pack_model_dir(str(path))


async def deploy(svc, token, model_tar, spec):
    return await svc.request(
        "POST",
        "/deployments",
        token=token,
        files={"spec": (None, json.dumps(spec)), "model": ("model.tar.gz", model_tar)},
    )


async def test_lineage_is_the_jobs_record_and_shown_to_who_may_call(tmp_path, model_tar):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        r = await svc.request("POST", "/jobs", token=alice, json={"code": CODE, "name": "t"})
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["code_hash"] == hashlib.sha256(CODE.encode()).hexdigest()
        assert job["datasets"] == []

        base = {"min_replicas": 0, "max_replicas": 1}
        quant = {"scheme": "int8-dynamic", "size_before": 100, "size_after": 40}
        # What the kernel claims of the job is replaced by the service's record.
        claim = {"job": {"id": job["id"], "code_hash": "forged"}, "quantization": quant}
        r = await deploy(svc, alice, model_tar, {"name": "m", **base, "lineage": claim})
        assert r.status_code == 201, r.text
        (v1,) = r.json()["versions"]
        assert v1["lineage"]["job"] == {
            "id": job["id"],
            "code_hash": job["code_hash"],
            "datasets": [],
        }
        assert v1["lineage"]["quantization"] == quant
        assert v1["lineage"]["created_by"] == "alice"

        # bob cannot claim alice's job, nor send what is not lineage.
        r = await deploy(svc, bob, model_tar, {"name": "b", **base, "lineage": claim})
        assert r.status_code == 400 and "not a job of yours" in r.json()["error"], r.text
        r = await deploy(svc, bob, model_tar, {"name": "b", **base, "lineage": {"run": 1}})
        assert r.status_code == 400, r.text
        # A model of no job says so.
        r = await deploy(svc, bob, model_tar, {"name": "b", **base, "lineage": None})
        assert r.status_code == 201, r.text
        assert r.json()["versions"][0]["lineage"]["job"] is None

        path = "/models/alice/m/lineage"
        mine = await svc.request("GET", path, token=alice)
        assert mine.status_code == 200, mine.text
        body = mine.json()
        assert (body["owner"], body["name"]) == ("alice", "m")
        (only,) = body["versions"]
        assert only["version"] == 1 and only["created_by"] == "alice" and only["created"]
        assert only["job"]["id"] == job["id"] and only["quantization"]["scheme"] == "int8-dynamic"
        # Admins see it; bob, with whom it is not shared, is refused like a call.
        assert (await svc.request("GET", path)).json() == body
        r = await svc.request("GET", path, token=bob)
        assert r.status_code == 403, r.text
        r = await svc.request("GET", "/models/alice/nope/lineage", token=bob)
        assert r.status_code == 403, r.text  # a stranger is not told which exist
        r = await svc.request("GET", "/models/alice/nope/lineage", token=alice)
        assert r.status_code == 404, r.text
        r = await svc.request("PATCH", "/deployments/m", token=alice, json={"share_users": ["bob"]})
        assert r.status_code == 200, r.text
        assert (await svc.request("GET", path, token=bob)).json() == body

        r = await svc.request("GET", "/audit", params={"action": "deployment.create"})
        (entry,) = [e for e in r.json()["entries"] if e["subject"] == "alice/m"]
        assert entry["detail"]["job"] == job["id"]
        assert entry["detail"]["code_hash"] == job["code_hash"]
        assert entry["detail"]["quantization"] == "int8-dynamic"

        assert (await svc.request("DELETE", f"/jobs/{job['id']}")).status_code == 200
        for owner, name in (("alice", "m"), ("bob", "b")):
            r = await svc.request("DELETE", f"/deployments/{name}", params={"user": owner})
            assert r.status_code == 200, r.text
