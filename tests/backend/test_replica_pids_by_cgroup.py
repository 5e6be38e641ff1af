"""Which process a serving replica's record stands for, once the service that started
it has restarted: the one the kernel lists in the replica's cgroup, not any process of
the owner whose command line names the deployment (a command line is the process's
own memory, which the owner's code in a replica can make a read of block). Live: real
accounts and cgroups (root in CI)."""

import json
import os
import subprocess
import sys

import pytest
from support.cgroup_accounts import cgroup_accounts

from gpulab.backend.local_replicas import LocalReplicas, replica_unit

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="accounts and cgroups need root (CI runs as root)"
)

DEP = "0123456789ab"


@pytest.fixture
def replicas(tmp_path):
    """Replicas run as their owner's account, in cgroups; a deployment folder made."""
    with cgroup_accounts(tmp_path, "rep") as (accounts, limits, user):
        backend = LocalReplicas(str(tmp_path / "deployments"), accounts=accounts, limits=limits)
        backend.prepare(DEP)
        account = accounts.ensure(user)
        procs = []

        def run(argv, in_group: bool) -> subprocess.Popen:
            """A process of the owner naming the model folder, in the replica's group or not."""
            run_as = account.popen_kwargs()
            if in_group:
                group = limits.group(account.name, replica_unit(DEP, 0), 100, 1)
                argv, run_as = group.launch(argv, **run_as)
            procs.append(subprocess.Popen(argv, start_new_session=True, **run_as))
            return procs[-1]

        try:
            yield backend, account, run
        finally:
            for p in procs:
                p.kill()
                p.wait()
            limits.remove(account.name, replica_unit(DEP, 0))


def test_a_restarted_service_knows_a_replica_by_its_cgroup(replicas):
    backend, account, run = replicas
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)", backend.model_dir(DEP)]
    replica = run(sleeper, in_group=True)
    other = run(sleeper, in_group=False)  # same owner, same command line

    def record(pid: int, group: bool) -> None:
        rec = {"pid": pid, "socket": "/nonexistent", "started": 0}
        if group:
            rec["group"] = f"{account.name}/{replica_unit(DEP, 0)}"
        with open(backend.path(DEP, "replica0.json"), "w") as f:
            json.dump(rec, f)

    # A fresh backend: none of these is its child, as after a service restart.
    record(replica.pid, group=True)
    assert backend.alive(DEP, 0)
    record(other.pid, group=True)
    assert not backend.alive(DEP, 0), "a process outside the replica's group was taken for it"
    # A record of an older service (no group in it) is still known by its command line.
    record(other.pid, group=False)
    assert backend.alive(DEP, 0)
    replica.kill()
    replica.wait()
    record(replica.pid, group=True)
    assert not backend.alive(DEP, 0)
