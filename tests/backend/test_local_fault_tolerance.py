"""A rank killed with SIGKILL mid-run: torchrun restarts every rank from the last
checkpoint and the job ends with the weights of an uninterrupted run.

Why exactly equal: each step's data comes from the step number, the checkpoint
holds the model and the optimizer's momentum, and two-rank gloo all-reduce on
CPU adds in a fixed order; so steps replayed after the restart compute the same
numbers as the first time.
"""

import json
import os
import signal

import pytest
import torch
from cells import LINEAR
from localrun import new_spec, run, weights
from support.wait import wait_until_async

from gpulab.backend.local import LocalBackend

pytestmark = pytest.mark.slow

MOMENTUM_LINEAR = LINEAR.replace("lr=0.05)", "lr=0.05, momentum=0.9)")
STEPS = 40
ENV = {"STEPS": str(STEPS), "STEP_DELAY": "0.15"}


def test_sigkill_one_rank_resumes_from_checkpoint_with_identical_weights(tmp_path):
    backend = LocalBackend(str(tmp_path / "jobs"))
    clean, clean_dir = run(
        backend,
        new_spec(MOMENTUM_LINEAR, nproc_per_node=2, out="model", checkpoint_every=10, env=ENV),
    )
    assert clean.state == "succeeded" and clean.restarts == 0, clean

    spec = new_spec(
        MOMENTUM_LINEAR, nproc_per_node=2, out="model", checkpoint_every=10, max_restarts=2, env=ENV
    )
    killed = {}

    def kill_rank_1_after_first_checkpoint():
        if killed:
            return
        jd = backend.jobdir(spec.id)
        try:
            latest = json.load(open(jd.p("checkpoints", "latest")))["step"]
            lines = open(jd.p("metrics", "rank0.jsonl")).read().splitlines()
        except (OSError, ValueError):
            return
        step = json.loads(lines[-1])["step"] if lines else 0
        if latest >= 10 and step >= latest + 3:  # past a checkpoint, mid-way to the next
            pid = json.load(open(jd.p("pids", "rank1.json")))["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, at_step=step, checkpoint=latest)

    status, jd = run(backend, spec, on_tick=kill_rank_1_after_first_checkpoint)
    assert killed, "the job ended before a rank could be killed"
    assert status.state == "succeeded", status
    assert status.restarts == 1
    events = open(jd.p("events.log")).read()
    assert (
        f"restart 1: a rank stopped; every rank restarted from checkpoint at step "
        f"{killed['checkpoint']}" in events
    )
    # After the restart, rank 0 reported again from the step after the checkpoint.
    records = [json.loads(ln) for ln in open(jd.p("metrics", "rank0.jsonl"))]
    resumed = [r["step"] for r in records if r["restart"] == 1]
    assert resumed[0] == killed["checkpoint"] and resumed[-1] == STEPS - 1
    assert json.load(open(jd.p("pids", "rank1.json")))["pid"] != killed["pid"]

    a, b = weights(clean_dir), weights(jd)
    for k in a:
        assert torch.equal(a[k], b[k]), (k, a[k], b[k])


def test_rank_death_without_restarts_fails_naming_the_cause(tmp_path):
    backend = LocalBackend(str(tmp_path / "jobs"))
    spec = new_spec(LINEAR, nproc_per_node=2, env={"STEPS": "400", "STEP_DELAY": "0.1"})
    killed = {}

    def kill_once():
        jd = backend.jobdir(spec.id)
        if not killed and os.path.exists(jd.p("metrics", "rank0.jsonl")):
            pid = json.load(open(jd.p("pids", "rank1.json")))["pid"]
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid

    status, jd = run(backend, spec, on_tick=kill_once)
    assert killed and status.state == "failed", status
    summary = open(jd.p("logs", "node0.log")).read()[-2500:]
    assert status.exit_code != 0
    # The killed rank is the root cause, not rank 0 whose all-reduce then broke.
    assert (
        status.message == f"rank 1 failed: Signal: Signal 9 (SIGKILL) received by PID "
        f"{killed['pid']}"
    ), (status, summary)
    assert status.error["rank"] == 1


def test_cancel_stops_every_process(tmp_path):
    import asyncio

    from cells import SLEEPS
    from localrun import prepare

    backend = LocalBackend(str(tmp_path / "jobs"))
    spec = new_spec(SLEEPS, nproc_per_node=2)
    jd = prepare(backend, spec)

    async def go():
        await backend.start(spec, [])
        await wait_until_async(
            lambda: os.path.exists(jd.p("metrics", "rank1.jsonl")), "rank 1's first metrics", 300
        )
        pids = [json.load(open(jd.p("pids", f"rank{r}.json")))["pid"] for r in (0, 1)]
        pids += [n["pid"] for n in json.load(open(jd.p("launch.json")))["nodes"]]
        await backend.cancel(spec)
        return pids

    pids = asyncio.run(go())
    for pid in pids:
        assert (
            not os.path.exists(f"/proc/{pid}")
            or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        )
