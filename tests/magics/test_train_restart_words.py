"""A restarted job says where its ranks resumed: the checkpoint's step, or step 0 when
there was no checkpoint (it used to say "from the last checkpoint" either way).

Real jobs (torchrun ranks on CPU) on the real service in this process (a stand-in hub
API): a rank exits once at step 3, torchrun restarts every rank (``max_restarts``),
and ``resume_range`` resumes them; the job's record says from where, and the magic's
status line tells it.
"""

from __future__ import annotations

import pytest
from support.service import running_service
from support.wait import wait_until_async

from gpulab.magics.train_display import describe

WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep
#: Ranks run as the service's own account (no per-user Unix accounts in a tmp dir).
CONFIG = "c.UserAccounts.enabled = False\n"
DIES_ONCE = """
import torch
from gpulab.training import setup, report, checkpoint

ctx = setup()
model = ctx.wrap(torch.nn.Linear(2, 1))
for step in checkpoint.resume_range(ctx, total_steps=5, state={"model": model}):
    report(loss=1.0)
    if step == 3 and ctx.restart == 0:
        raise SystemExit("this rank dies once, on purpose")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "every, restarted_from, words",
    [
        (2, [2], "restarted 1 time, from the checkpoint at step 2"),
        (0, [None], "restarted 1 time, from step 0 (no checkpoint)"),
    ],
)
async def test_a_restart_says_the_step_it_resumed_from(tmp_path, every, restarted_from, words):
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        alice = svc.create_user("alice")
        spec = {"code": DIES_ONCE, "name": "once", "max_restarts": 1, "checkpoint_every": every}
        r = await svc.request("POST", "/jobs", token=alice, json=spec)
        assert r.status_code == 201, r.text

        async def ended():
            job = (await svc.request("GET", f"/jobs/{r.json()['id']}", token=alice)).json()
            return job if job["state"] in ("succeeded", "failed") else None

        job = await wait_until_async(ended, "the job to end", WAIT_S, 0.3)
        assert job["state"] == "succeeded" and job["restarts"] == 1, job
        assert job["restarted_from"] == restarted_from
        assert describe(job).endswith(f": succeeded; {words}"), describe(job)
        assert "last checkpoint" not in describe(job)


def test_the_words_for_several_restarts_and_an_older_service():
    job = {"id": "j", "name": "n", "state": "running", "restarts": 2}
    assert describe({**job, "restarted_from": [4, None]}).endswith(
        "; restarted 2 times, the last from step 0 (no checkpoint)"
    )
    assert describe({**job, "restarted_from": [4, 8]}).endswith(
        "; restarted 2 times, the last from the checkpoint at step 8"
    )
    # A service that does not say where: no claim about a checkpoint.
    assert describe(job).endswith(": running; restarted 2 times")
