"""Preemption inside a rank: SIGTERM becomes a checkpoint at the next step boundary.

The service asks a preemptible job to make room by sending every rank SIGTERM,
then waits a grace period (``c.JobQueue.preemption_grace_seconds``) before
it kills what is left. The runner turns SIGTERM into a flag
(:func:`install`); :func:`~gpulab.training.checkpoint.resume_range` looks at it
after every step, and since the signal reaches ranks at slightly different
moments, the ranks agree (an all-reduce of the flag, max) so that all of them
stop after the same step. They save a checkpoint there, rank 0 records the step
in ``pids/preempted.json``, and every rank exits cleanly. The job goes back to
the queue and, when it starts again, ``resume_range`` loads that checkpoint, as
after a failure. This is how NeMo and Hugging Face ``--signal=TERM@...``
handle a scheduler's SIGTERM, and Slurm's ``GraceTime``.

Code that never calls ``resume_range`` keeps running until the grace period
ends and is then killed: it starts over when it runs again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

from . import env

#: Written by rank 0 when the ranks stopped for a preemption: ``{"step": N}``.
MARKER = os.path.join("pids", "preempted.json")
#: Written by the service (in the job dir) while it resizes an elastic job: the ranks
#: stop as for a preemption, but the job goes on at once at its new size.
RESIZING = "resizing.json"
#: Written by rank 0 once its steps run under ``resume_range``: this run stops at a
#: step boundary with a checkpoint when asked, so the service may resize an elastic
#: job without losing work (a cell that never calls it would start over).
RESUMABLE = os.path.join("pids", "resumable.json")

_asked = threading.Event()


class Preempted(SystemExit):
    """Raised at the step boundary after a preemption's checkpoint: a clean exit."""

    def __init__(self, step: int):
        super().__init__(0)
        self.step = step


def install() -> None:
    """Make SIGTERM a request to stop at the next step boundary (main thread only)."""
    signal.signal(signal.SIGTERM, lambda *_: _asked.set())


def asked() -> bool:
    """Did this rank get SIGTERM?"""
    return _asked.is_set()


def agreed(ctx) -> bool:
    """Do the ranks stop here? True on every rank when any rank was asked."""
    import torch.distributed as dist

    if ctx.world_size == 1 or not dist.is_initialized():
        return asked()
    import torch

    flag = torch.tensor([1 if asked() else 0], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def record(ctx, step: int) -> None:
    """Rank 0 notes where the ranks stopped, for the service and the job's events."""
    _note(ctx, MARKER, {"step": step})


def stopped(step: int) -> str:
    """What the job's events say once the ranks saved a checkpoint and stop."""
    job_dir = env.get(env.JOB_DIR)
    if job_dir and os.path.exists(os.path.join(job_dir, RESIZING)):
        return f"saved a checkpoint at step {step} to change size"
    return f"preempted: saved a checkpoint at step {step}; the job waits in the queue"


def resumable(ctx, step: int) -> None:
    """Rank 0 notes that this run stops at step boundaries when asked (from ``step``).
    A hint for the scheduler: a job dir it cannot write to never fails the run."""
    with contextlib.suppress(OSError):
        _note(ctx, RESUMABLE, {"step": step, "time": time.time()})


def _note(ctx, name: str, data: dict) -> None:
    job_dir = env.get(env.JOB_DIR)
    if ctx.rank != 0 or not job_dir:
        return
    path = os.path.join(job_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
