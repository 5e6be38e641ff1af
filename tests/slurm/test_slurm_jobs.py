"""Training jobs on the Slurm backend, through the real service, on a 2-node sandbox.

The service is the in-process one (tests/support/service.py) running as root, so
every hub user gets a Unix account of their own (``gpulab-<name>``) and the
jobs are submitted for it (``sbatch --uid --gid``). Each job is one Slurm job
across both nodes (``srun`` starts one torchrun agent per node).
"""

import asyncio
import json
import os
import pwd
import signal
import subprocess

import pytest
import torch
from cells import FAILS_ON_RANK_1, LINEAR
from slurmhelpers import TERMINAL, needs_slurm, service_config, wait_job
from support.service import running_service
from support.wait import wait_until_async

from gpulab.backend.slurm_sandbox import env as sandbox_env
from gpulab.hub_ext.slurm_cli import config_text

pytestmark = [needs_slurm, pytest.mark.slow, pytest.mark.netns]


def squeue(sandbox, *args, user=None) -> str:
    argv = ["squeue", "-h", *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    env = {**os.environ, **sandbox_env(sandbox["data_dir"])}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr  # an empty list must mean "no jobs"
    return done.stdout


def jobdir(svc, job_id):
    return svc.data_dir / "jobs" / job_id


async def submit(svc, token, **fields):
    # No backend named: the site's (Slurm) is every job's default.
    body = {"code": LINEAR, "nodes": 2, "nproc_per_node": 1, **fields}
    r = await svc.request("POST", "/jobs", token, json=body)
    assert r.status_code in (200, 201), r.text
    return r.json()


@pytest.fixture
async def svc(slurm_base, sandbox):
    async with running_service(slurm_base / "service", service_config(sandbox), simulate="") as s:
        yield s


# Each rank says who and where it runs (its log is logs/rank<R>.log).
WHO = """
import getpass, os, socket
leaked = sorted(k for k in os.environ if k.startswith(("JUPYTERHUB_", "GPULAB_API")))
print(f"whoami {getpass.getuser()} on {socket.gethostname()} leaked={leaked}", flush=True)
"""
# A quarter GPU per rank: 5 of the sandbox's 20 shards per GPU.
FIELDS = dict(out="model", checkpoint_every=10, gpu_milli=250, env={"STEPS": "20"})


def who(jd, rank) -> str:
    for line in (jd / "logs" / f"rank{rank}.log").read_text().splitlines():
        if line.startswith("whoami "):
            return line
    raise AssertionError(f"rank {rank} did not say who it is")


async def metrics_at_least(svc, token, job_id, n, timeout=180):
    async def enough():
        m = (await svc.request("GET", f"/jobs/{job_id}/metrics", token)).json()
        assert m["state"] not in TERMINAL, m["state"]
        return m["records"] if len(m["records"]) >= n else None

    return await wait_until_async(enough, f"{n} metrics of job {job_id}", timeout, every=0.3)


@pytest.fixture(scope="module")
async def local_weights(sandbox, slurm_base) -> dict:
    """The weights FIELDS' job trains on the box (the local backend), for the tests
    that compare the Slurm runs with them. The site is the box and the cluster
    (`slurm-sandbox up --hybrid`); its service stops before the tests' own start."""
    data = slurm_base / "hybrid"
    data.mkdir()
    os.chmod(data, 0o755)  # the ranks' accounts pass through it
    async with running_service(data, config_text(sandbox, hybrid=True)) as svc:
        alice = svc.create_user("alice")
        local = await submit(svc, alice, pool="box", **FIELDS)
        assert (await wait_job(svc, alice, local["id"]))["state"] == "succeeded"
        return torch.load(jobdir(svc, local["id"]) / "out" / "state_dict.pt")


async def test_two_node_job_is_one_slurm_job_with_the_local_weights(
    sandbox, slurm_base, local_weights
):
    # The same job on the cluster's pool of a site of the box and the cluster.
    data = slurm_base / "hybrid-slurm"
    data.mkdir()
    os.chmod(data, 0o755)
    async with running_service(data, config_text(sandbox, hybrid=True)) as svc:
        alice = svc.create_user("alice")
        job = await submit(svc, alice, code=WHO + LINEAR, pool="slurm", **FIELDS)
        done = await wait_job(svc, alice, job["id"])
        assert done["state"] == "succeeded", done
        check_the_slurm_job(svc, done, sandbox, local_weights)


def check_the_slurm_job(svc, job, sandbox, local_weights):
    jd = jobdir(svc, job["id"])
    slurm_id = (jd / "slurm" / "job_id").read_text().strip()
    assert job["slurm_job_id"] == slurm_id  # the job listing names the Slurm job
    launch = json.loads((jd / "launch.json").read_text())
    assert launch["slurm_job_id"] == slurm_id
    # Both nodes in one allocation, a quarter GPU (5 shards of 20) per node's rank.
    assert "--nodes=2" in launch["sbatch"] and "--gres=shard:5" in launch["sbatch"]
    # One allocation across both nodes: each node's agent logged under one Slurm job id.
    for node in (0, 1):
        assert (jd / "pids" / f"node{node}.exit").read_text().strip() == "0"
    # The two ranks ran on the two sandbox nodes, as alice's account, and those are
    # the nodes the ledger placed the node ranks on (sbatch --nodelist).
    nodes = sorted(n["name"] for n in sandbox["nodes"])
    assert sorted(json.loads((jd / "slurm" / "nodes.json").read_text())) == nodes
    assert sorted(who(jd, r).split()[3] for r in (0, 1)) == nodes
    assert {who(jd, r).split()[1] for r in (0, 1)} == {"gpulab-alice"}
    # Only PASS_ENV and the job's own variables: none of the service's tokens.
    assert {who(jd, r).split()[4] for r in (0, 1)} == {"leaked=[]"}
    assert_same_weights(torch.load(jd / "out" / "state_dict.pt"), local_weights)


def assert_same_weights(got, want):
    assert want and got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k


async def test_killed_rank_on_node_1_restarts_from_the_checkpoint(svc, sandbox, local_weights):
    alice = svc.create_user("alice")
    fields = {**FIELDS, "env": {**FIELDS["env"], "STEP_DELAY": "0.3"}, "max_restarts": 2}
    job = await submit(svc, alice, **fields)
    jd = jobdir(svc, job["id"])

    async def checkpointed():
        latest = jd / "checkpoints" / "latest"
        return latest.exists() and json.loads(latest.read_text()).get("step", 0) >= 10

    await wait_until_async(checkpointed, "a checkpoint at step 10", 180, every=0.2)
    pid = json.loads((jd / "pids" / "rank1.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    done = await wait_job(svc, alice, job["id"])
    assert done["state"] == "succeeded", done
    assert done["restarts"] == 1, done
    # Resumed, not started over: the weights are those of an uninterrupted run.
    assert_same_weights(torch.load(jd / "out" / "state_dict.pt"), local_weights)


# Each rank says what Slurm told its node's task (srun's SLURM_* variables).
SLURM_VARS = """
import json, os, socket
names = ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_CLUSTER_NAME",
         "SLURM_PROCID", "SLURM_NTASKS")
seen = {k: os.environ.get(k) for k in names}
seen.update(rank=int(os.environ["RANK"]), host=socket.gethostname())
print("slurmenv " + json.dumps(seen), flush=True)
"""


async def test_ranks_see_slurms_variables_under_the_node_files(svc, sandbox):
    alice = svc.create_user("alice")
    # The job's own variables are the node file's: they win over Slurm's.
    job = await submit(svc, alice, code=SLURM_VARS, env={"SLURM_CLUSTER_NAME": "mine"})
    done = await wait_job(svc, alice, job["id"])
    assert done["state"] == "succeeded", done
    jd = jobdir(svc, job["id"])
    slurm_id = (jd / "slurm" / "job_id").read_text().strip()
    seen = []
    for rank in (0, 1):
        lines = (jd / "logs" / f"rank{rank}.log").read_text().splitlines()
        (line,) = [ln for ln in lines if ln.startswith("slurmenv ")]
        seen.append(json.loads(line.split(" ", 1)[1]))
    assert [s["rank"] for s in seen] == [0, 1]
    assert {s["SLURM_JOB_ID"] for s in seen} == {slurm_id}
    # Each rank has its own node's id: Slurm numbers the job's nodes in name order.
    names = sorted(n["name"] for n in sandbox["nodes"])
    by_host = sorted((s["host"], s["SLURM_NODEID"]) for s in seen)
    assert by_host == [(names[0], "0"), (names[1], "1")], seen
    nodelist = {s["SLURM_JOB_NODELIST"] for s in seen}
    assert len(nodelist) == 1 and nodelist.pop(), seen
    assert {s["SLURM_CLUSTER_NAME"] for s in seen} == {"mine"}
    # Not the launcher's task's rank and world (torchrun's RANK/WORLD_SIZE are the
    # ranks'): Lightning would read these first and take the wrong rank.
    assert {(s["SLURM_PROCID"], s["SLURM_NTASKS"]) for s in seen} == {(None, None)}


async def test_a_failing_rank_fails_the_slurm_job_with_its_root_cause(svc, sandbox):
    alice = svc.create_user("alice")
    job = await submit(svc, alice, code=FAILS_ON_RANK_1)
    done = await wait_job(svc, alice, job["id"])
    assert done["state"] == "failed", done
    assert "rank 1 failed: ValueError: bad batch shape on purpose" in done["message"], done
    slurm_id = (jobdir(svc, job["id"]) / "slurm" / "job_id").read_text().strip()
    assert squeue(sandbox, "-j", slurm_id, "-o", "%i").strip() == ""


FAKES_ITS_END = """
import os, time
pids = os.path.join(os.environ["GPULAB_JOB_DIR"], "pids")
for node in range(2):  # what the launchers write when the nodes end
    with open(os.path.join(pids, f"node{node}.exit"), "w") as f:
        f.write("0\\n")
print("wrote the exit files", flush=True)
time.sleep(600)
"""


async def test_a_job_that_writes_its_own_exit_files_runs_on_in_gpulab_too(svc, sandbox):
    """The exit files are in a folder the ranks can write: a job writing 0s and going
    on must not be ended in gpulab (its slices given to others) while Slurm holds its
    nodes."""
    alice = svc.create_user("alice")
    job = await submit(svc, alice, code=FAKES_ITS_END)
    jd = jobdir(svc, job["id"])
    await wait_until_async(
        lambda: (jd / "pids" / "node1.exit").exists() and (jd / "pids" / "node0.exit").exists(),
        "the job's fake exit files",
        180,
    )
    slurm_id = (jd / "slurm" / "job_id").read_text().strip()
    await asyncio.sleep(5)  # several passes of the job loop (one a second)
    now = (await svc.request("GET", f"/jobs/{job['id']}", alice)).json()
    assert now["state"] == "running", now
    assert squeue(sandbox, "-j", slurm_id, "-o", "%T").strip() == "RUNNING"
    assert (await svc.request("DELETE", f"/jobs/{job['id']}", alice)).status_code == 200
    assert (await wait_job(svc, alice, job["id"]))["state"] == "cancelled"


async def test_only_the_owner_sees_and_cancels_and_cancel_leaves_no_slurm_job(
    svc, sandbox, slurm_base
):
    alice, bob = svc.create_user("alice"), svc.create_user("bob")
    gate = slurm_base / "gate-never"  # never opened: the job waits at step 5
    job = await submit(svc, alice, env={"STEPS": "30", "GATE": str(gate)})
    await metrics_at_least(svc, alice, job["id"], 5)
    jd = jobdir(svc, job["id"])
    slurm_id = (jd / "slurm" / "job_id").read_text().strip()

    # The ranks run as alice's account, on both nodes.
    uid = pwd.getpwnam("gpulab-alice").pw_uid
    for rank in (0, 1):
        pid = json.loads((jd / "pids" / f"rank{rank}.json").read_text())["pid"]
        status = open(f"/proc/{pid}/status").read()
        assert f"Uid:\t{uid}\t" in status, status
    # Slurm shows it to alice only (PrivateData=jobs) ...
    assert slurm_id in squeue(sandbox, "-o", "%i", user="gpulab-alice").split()
    svc.app.accounts.ensure("bob")
    assert squeue(sandbox, "-o", "%i", user="gpulab-bob").split() == []
    # ... and so does gpulab.
    assert (await svc.request("GET", f"/jobs/{job['id']}", bob)).status_code == 404
    assert (await svc.request("DELETE", f"/jobs/{job['id']}", bob)).status_code in (403, 404)
    assert job["id"] not in [j["id"] for j in (await svc.request("GET", "/jobs", bob)).json()]
    # bob's own scancel is refused by Slurm too.
    refused = subprocess.run(
        ["runuser", "-u", "gpulab-bob", "--", "scancel", slurm_id],
        env={**os.environ, **sandbox_env(sandbox["data_dir"])},
        capture_output=True,
        text=True,
    )
    assert squeue(sandbox, "-j", slurm_id, "-o", "%T").strip() == "RUNNING", refused.stderr

    r = await svc.request("DELETE", f"/jobs/{job['id']}", alice)
    assert r.status_code in (200, 202, 204), r.text
    done = await wait_job(svc, alice, job["id"])
    assert done["state"] == "cancelled", done

    async def gone():
        return squeue(sandbox, "-j", slurm_id, "-o", "%i").strip() == ""

    await wait_until_async(gone, f"Slurm job {slurm_id} gone from squeue", 60, every=0.2)
    assert squeue(sandbox, "-o", "%i %j").strip() == ""


async def test_a_restarted_service_reattaches_by_slurm_job_id(sandbox, slurm_base, caplog):
    data = slurm_base / "restart"
    gate = slurm_base / "gate-restart"
    async with running_service(data, service_config(sandbox), simulate="") as first:
        alice = first.create_user("alice")
        job = await submit(first, alice, env={"STEPS": "12", "GATE": str(gate)})
        await metrics_at_least(first, alice, job["id"], 5)
        hub = first.fake_hub
    # No service now; the Slurm job runs on, held at step 5.
    slurm_id = (data / "jobs" / job["id"] / "slurm" / "job_id").read_text().strip()
    assert squeue(sandbox, "-j", slurm_id, "-o", "%T").strip() == "RUNNING"
    caplog.set_level("INFO", logger="gpulab.service.jobs")  # the job manager and its parts
    async with running_service(data, service_config(sandbox), simulate="", fake_hub=hub) as second:
        assert f"Job {job['id']}: re-attached" in caplog.text
        gate.touch()
        done = await wait_job(second, alice, job["id"])
        assert done["state"] == "succeeded", done
        metrics = (await second.request("GET", f"/jobs/{job['id']}/metrics", alice)).json()
        assert len(metrics["records"]) == 12
    # The same Slurm job all along: nothing was submitted again.
    assert (data / "jobs" / job["id"] / "slurm" / "job_id").read_text().strip() == slurm_id


async def test_preempt_makes_the_ranks_checkpoint_and_stop(sandbox, slurm_base):
    """The backend alone (the service's preemption path calls exactly this): SIGTERM
    to the ranks through a step of the job on each node, run as the owner; they agree
    on a step, checkpoint there and exit cleanly, and rank 0 notes the step."""
    from gpulab.backend.jobdir import JobDir
    from gpulab.backend.slurm import SlurmBackend
    from gpulab.backend.slurm_site import SlurmSite
    from gpulab.backend.spec import JobSpec
    from gpulab.enforcement.accounts import UserAccounts

    root = slurm_base / "preempt-jobs"
    root.mkdir()
    site = SlurmSite(slurm_conf=sandbox_env(sandbox["data_dir"])["SLURM_CONF"])
    # As the service runs it as root: the ranks, and the preempting step, as the owner.
    backend = SlurmBackend(str(root), site=site, accounts=UserAccounts())
    spec = JobSpec(
        code=LINEAR, nodes=2, nproc_per_node=1, backend="slurm", env={"STEP_DELAY": "0.3"}
    )
    spec.id, spec.user = "preempt0001", "alice"
    spec.validate()
    jd = JobDir(str(root), spec.id)
    root.joinpath(spec.id).mkdir()
    spec.checkpoint_dir = jd.p("checkpoints")
    jd.write_inputs(spec)
    await backend.start(spec, [])
    try:

        async def stepping():
            path = root / spec.id / "metrics" / "rank0.jsonl"
            return path.exists() and len(path.read_text().splitlines()) >= 3

        await wait_until_async(stepping, "3 steps", 180, every=0.2)
        await backend.preempt(spec)

        async def ended():
            status = await backend.poll(spec)
            return status if status.state != "running" else None

        status = await wait_until_async(ended, "the job to stop", 120, every=0.2)
    finally:
        await backend.cancel(spec)
    assert status.state == "succeeded", status
    step = jd.preempted_at()
    assert step is not None and step < 30, step  # stopped early, at a step boundary
    assert jd.checkpoint()["step"] == step


async def test_an_elastic_job_goes_on_without_a_failed_node_then_regrows(sandbox, slurm_base):
    """``--nodes 1:2`` on Slurm: a rank killed on node 1 ends that Slurm job; the
    service goes on with one node (a new one-node allocation, from the last
    checkpoint), then grows back to both (a two-node allocation again)."""
    from cells import ELASTIC

    data = slurm_base / "elastic"
    data.mkdir()
    os.chmod(data, 0o755)  # the ranks' accounts pass through it
    config = service_config(sandbox) + "c.JobQueue.elastic_grow_after_seconds = 2\n"
    async with running_service(data, config, simulate="") as svc:
        alice = svc.create_user("alice")
        body = {"min_nodes": 1, "max_nodes": 2, "max_restarts": 1, "checkpoint_every": 5}
        env = {"STEPS": "40", "STEP_DELAY": "0.3"}
        job = await submit(svc, alice, code=ELASTIC, gpu_milli=250, env=env, **body)
        jd = jobdir(svc, job["id"])
        records = await metrics_at_least(svc, alice, job["id"], 8)
        assert records[-1]["world_size"] == 2  # both nodes were free: it started on both
        pid = json.loads((jd / "pids" / "rank1.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)

        async def regrown():
            j = (await svc.request("GET", f"/jobs/{job['id']}", alice)).json()
            assert j["state"] in ("running", "succeeded"), j
            return j if [r["nodes"] for r in j["resizes"]] == [1, 2] else None

        grown = await wait_until_async(regrown, "the job at 1 node, then 2", 180, every=0.3)
        assert "rank 1 failed" in grown["resizes"][0]["reason"], grown["resizes"]
        done = await wait_job(svc, alice, job["id"])
        assert done["state"] == "succeeded" and done["restarts"] == 1, done
        launch = json.loads((jd / "launch.json").read_text())
        assert "--nodes=2" in launch["sbatch"]  # the last allocation: both nodes again
        m = (await svc.request("GET", f"/jobs/{job['id']}/metrics", alice)).json()["records"]
        assert m[-1]["step"] == 39 and 1 in {r["world_size"] for r in m}
