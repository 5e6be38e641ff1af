"""Which processes a job's stop signals, where its nodes run in cgroups: those the
kernel lists in the job's cgroups, not whatever a rank's pid file names.

The pid files are the job owner's to write, and the command line that used to be
checked is the process's own memory, which its owner can make a read of block (a
FUSE file behind it): where the job has cgroups, their member list (the kernel's)
decides. Live: real accounts and cgroups (root in CI).
"""

import asyncio
import json
import os
import subprocess
import sys

import pytest
from cells import SLEEPS
from localrun import new_spec, prepare
from support.cgroup_accounts import cgroup_accounts
from support.wait import wait_until_async

from gpulab.backend.local import LocalBackend

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="accounts and cgroups need root (CI runs as root)"
)


@pytest.fixture
def limited(tmp_path):
    """A local backend whose job nodes run in cgroups as their owner's account."""
    with cgroup_accounts(tmp_path, "pid") as (accounts, limits, user):
        (tmp_path / "jobs").mkdir()
        yield LocalBackend(str(tmp_path / "jobs"), accounts=accounts, limits=limits), user


async def training(backend, spec, jd) -> int:
    """Start the job; once its rank has reported a step, that rank's pid."""
    await backend.start(spec, [])
    await wait_until_async(
        lambda: os.path.exists(jd.p("metrics", "rank0.jsonl")), "rank 0's first metrics", 300
    )
    return json.load(open(jd.p("pids", "rank0.json")))["pid"]


def test_a_pid_file_naming_the_owners_other_process_stops_only_the_jobs(limited):
    backend, user = limited
    spec = new_spec(SLEEPS, nproc_per_node=1, user=user)
    jd = prepare(backend, spec)

    async def go():
        rank = await training(backend, spec, jd)
        account = backend.accounts.lookup(user)
        # The owner's own process outside the job, its command line naming the job's
        # folder (what the old check looked for), written into a pid file of the job.
        other = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", jd.path],
            user=account.uid,
            group=account.gid,
        )
        try:
            with open(jd.p("pids", "rank7.json"), "w") as f:
                json.dump({"pid": other.pid}, f)
            os.chown(jd.p("pids", "rank7.json"), account.uid, account.gid)  # as if written by it
            await backend.cancel(spec)
            rank_left = os.path.exists(f"/proc/{rank}") and not zombie(rank)
            return rank_left, other.poll()
        finally:
            other.kill()
            other.wait()

    rank_left, other_code = asyncio.run(go())
    assert not rank_left, "the job's rank outlived its cancel"
    assert other_code is None, f"a process outside the job's cgroups was stopped ({other_code})"


def zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_a_job_whose_cgroups_the_host_refused_is_still_found_after_a_restart(limited, monkeypatch):
    backend, user = limited
    # The host refused the nodes' groups (AccountLimits.group says so and returns
    # None): the job runs unlimited, and its processes are known by their command line.
    monkeypatch.setattr(backend.limits, "group", lambda *a, **k: None)
    spec = new_spec(SLEEPS, nproc_per_node=1, user=user)
    jd = prepare(backend, spec)

    async def go():
        rank = await training(backend, spec, jd)
        # The service restarts: a new backend, the nodes no longer its children.
        again = LocalBackend(backend.root, accounts=backend.accounts, limits=backend.limits)
        running = await again.reattach(spec)
        await again.cancel(spec)
        return running, rank

    running, rank = asyncio.run(go())
    assert running, "the restarted service took the running job for ended"
    assert not os.path.exists(f"/proc/{rank}") or zombie(rank)
