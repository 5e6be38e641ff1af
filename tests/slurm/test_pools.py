"""A site of two pools on the real Slurm sandbox, with the config `gpulab slurm-sandbox
up --hybrid` writes: the box (this machine, one simulated GPU) first, the Slurm
cluster second. A job that names no pool runs on the first with
room: the box while it has room, Slurm once the box is full; the ledger, usage and
``GET /pools`` see both, and another user sees none of it.

And the Slurm sandbox's own single-pool site: a job that names no backend is one Slurm
job across both nodes, never torchrun on the service's machine.

Real Slurm (the 2-node sandbox), real torchrun on the box, the in-process service.
"""

import os
import tempfile
from pathlib import Path

import pytest
from slurmhelpers import TERMINAL, needs_slurm, service_config, wait_job
from support.service import running_service

from gpulab.hub_ext.slurm_cli import HYBRID_BOX_GPUS, config_text

pytestmark = [needs_slurm, pytest.mark.slow, pytest.mark.netns]

BOX = HYBRID_BOX_GPUS  # one GPU: one job fills the box
HOLD = "import time\nwhile True:\n    time.sleep(0.5)\n"
HELLO = "import socket\nprint('hello from', socket.gethostname())\n"


def two_pools(sandbox: dict) -> str:
    """The config `gpulab slurm-sandbox up --hybrid` writes for this sandbox."""
    return config_text(sandbox, hybrid=True)


async def post_job(svc, token, **fields) -> dict:
    r = await svc.request("POST", "/jobs", token, json={"code": HELLO, **fields})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
async def site(slurm_base, sandbox):
    data = Path(tempfile.mkdtemp(prefix="pools-", dir=slurm_base))  # a service of its own
    os.chmod(data, 0o755)
    # As `gpulab up --simulate-gpus 1xA100-80GB` gives the box its GPU.
    async with running_service(data, two_pools(sandbox), simulate=BOX) as svc:
        yield svc


async def test_the_box_first_then_slurm_takes_the_overflow(site, sandbox):
    svc = site
    alice, bob = svc.create_user("alice"), svc.create_user("bob")
    slurm_nodes = {n["name"] for n in sandbox["nodes"]}

    pools = (await svc.request("GET", "/pools", alice)).json()
    assert pools["default"] == "auto"
    assert [(p["name"], p["backend"], p["gpus"]) for p in pools["pools"]] == [
        ("box", "local", 1),
        ("slurm", "slurm", 4),
    ]
    inventory = (await svc.request("GET", "/inventory", alice)).json()
    assert {n["name"]: n["pool"] for n in inventory["nodes"]} == {
        svc.app.inventory_settings.node_name: "box",
        **{n: "slurm" for n in slurm_nodes},
    }

    # The box has room: a job that names no pool runs there.
    hold = await post_job(svc, alice, code=HOLD, gpu_milli=1000, name="hold")
    assert hold["pool"] == "auto"
    hold = await wait_job(svc, alice, hold["id"], ("running",) + TERMINAL)
    assert (hold["state"], hold["pool"], hold["backend"]) == ("running", "box", "local")

    # The box is full: the next one goes to Slurm, says why, and succeeds there.
    job = await post_job(svc, alice, gpu_milli=250)
    running = await wait_job(svc, alice, job["id"], ("running",) + TERMINAL, timeout=60)
    assert (running["pool"], running["backend"]) == ("slurm", "slurm")
    assert running["message"].startswith("starting on pool slurm: pool box had no room"), running
    rows = [
        a
        for a in (await svc.request("GET", "/allocations", alice)).json()
        if a["owner"] == f"{job['id']}/0"
    ]
    assert rows and {a["node"] for a in rows} <= slurm_nodes
    done = await wait_job(svc, alice, job["id"], TERMINAL)
    assert done["state"] == "succeeded", done
    assert done["slurm_job_id"] and done["slurm_job_id"].isdigit()
    logs = (await svc.request("GET", f"/jobs/{job['id']}/logs", alice)).text
    assert "job started in pool slurm" in logs and "pool box had no room" in logs
    assert "hello from " in logs

    # Usage by pool: both pools, for the admin; alice sees her own.
    usage = (await svc.request("GET", "/usage?group_by=pool")).json()
    assert {r["pool"] for r in usage["rows"]} == {"box", "slurm"}, usage
    mine = (await svc.request("GET", "/usage?group_by=pool", alice)).json()
    assert {r["pool"] for r in mine["rows"]} == {"box", "slurm"}

    # Another user sees none of it.
    assert (await svc.request("GET", "/jobs", bob)).json() == []
    assert (await svc.request("GET", f"/jobs/{job['id']}", bob)).status_code == 404
    assert (await svc.request("GET", f"/jobs/{job['id']}/logs", bob)).status_code == 404
    assert (await svc.request("GET", "/usage?group_by=pool", bob)).json()["rows"] == []
    assert (await svc.request("GET", "/allocations", bob)).json() == []

    # Naming a pool that is full waits for it rather than going elsewhere.
    pinned = await post_job(svc, alice, gpu_milli=250, pool="box")
    queued = (await svc.request("GET", f"/jobs/{pinned['id']}", alice)).json()
    assert queued["state"] == "queued" and queued["pool"] == "box"
    for j in (pinned, hold):
        r = await svc.request("DELETE", f"/jobs/{j['id']}", alice)
        assert r.status_code == 200, r.text


async def test_a_pool_or_backend_the_site_has_not_got_is_refused_with_its_pools(site):
    alice = site.create_user("alice")
    for fields, message in (
        ({"pool": "cloud"}, "no pool 'cloud' here; this site's pools: box (local), slurm"),
        ({"backend": "kubernetes"}, "no pool runs the kubernetes backend here"),
        ({"pool": "box", "backend": "slurm"}, "pool 'box' runs jobs on local, not slurm"),
    ):
        r = await site.request("POST", "/jobs", alice, json={"code": HELLO, **fields})
        assert r.status_code == 400 and message in r.json()["error"], r.text
    assert (await site.request("GET", "/jobs", alice)).json() == []


async def test_the_sandbox_site_runs_a_job_without_backend_as_one_slurm_job(slurm_base, sandbox):
    config = service_config(sandbox)
    async with running_service(slurm_base / "one-pool", config, simulate="") as svc:
        alice = svc.create_user("alice")
        job = await post_job(svc, alice, nodes=2)  # no backend, no pool
        assert (job["pool"], job["backend"]) == ("slurm", "slurm")
        done = await wait_job(svc, alice, job["id"], TERMINAL)
        assert done["state"] == "succeeded", done
        launch = (svc.data_dir / "jobs" / job["id"] / "launch.json").read_text()
        assert '"backend": "slurm"' in launch and "--nodes=2" in launch
        logs = (await svc.request("GET", f"/jobs/{job['id']}/logs", alice)).text
        assert logs.count("hello from ") == 2, logs  # one rank per node
        # And a local job is refused: the service's machine runs none here.
        r = await svc.request("POST", "/jobs", alice, json={"code": HELLO, "backend": "local"})
        assert r.status_code == 400
        assert r.json()["error"].startswith("this site runs jobs on its Slurm cluster")
        assert os.listdir(svc.data_dir / "jobs") == [job["id"]]
