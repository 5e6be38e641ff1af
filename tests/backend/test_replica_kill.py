"""Stopping a deployment's replicas signals only processes that are still them.

The SIGKILL that follows the grace period went to every pid collected before the
SIGTERM, the replicas that had exited meanwhile included: by then such a pid may be
another process's (a pid is reused once its process is reaped). Each replica is now
looked at again, through a pidfd opened before it was checked to be the replica,
before each signal. (Pid reuse itself cannot be staged here: what is shown is that a
replica gone before the SIGKILL gets none.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from gpulab.backend.local_serving import LocalServing

STAYS = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
LEAVES = "import time"


def replica(serving: LocalServing, dep_id: str, index: int, code: str) -> subprocess.Popen:
    """A process in a session of its own standing for replica ``index`` (recorded as
    the service records one it started)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{code}; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout.readline() == b"up\n"  # its SIGTERM handler is in place
    os.makedirs(serving.path(dep_id), exist_ok=True)
    with open(serving.path(dep_id, f"replica{index}.json"), "w") as f:
        json.dump({"pid": proc.pid, "socket": "/nonexistent", "started": 1}, f)
    serving._children[(dep_id, index)] = proc  # noqa: SLF001 - as start_replica keeps it
    return proc


async def test_a_replica_gone_during_the_grace_period_gets_no_sigkill(tmp_path, monkeypatch):
    serving = LocalServing(str(tmp_path / "deployments"))
    leaves = replica(serving, "d1", 0, LEAVES)  # exits at SIGTERM
    stays = replica(serving, "d1", 1, STAYS)  # waits for its SIGKILL
    sent: list[tuple[int, int]] = []
    killpg = os.killpg

    def spy(pgid, sig):
        sent.append((pgid, sig))
        killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    try:
        await serving.kill({"id": "d1", "user": "alice"}, range(2), grace_s=1.0)
    finally:
        for proc in (leaves, stays):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
    assert (leaves.pid, signal.SIGTERM) in sent and (stays.pid, signal.SIGTERM) in sent
    assert (stays.pid, signal.SIGKILL) in sent
    assert (leaves.pid, signal.SIGKILL) not in sent  # it had gone: its pid may be another's
    assert stays.returncode == -signal.SIGKILL and leaves.returncode == -signal.SIGTERM
    assert not os.path.exists(serving.path("d1", "replica0.json"))
