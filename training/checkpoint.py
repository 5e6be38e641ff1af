"""Checkpoints with ``torch.distributed.checkpoint`` and automatic resume.

``resume_range(ctx, total_steps, state)`` yields step numbers. Before the
first it loads the newest complete checkpoint (if any) into ``state``; after
every ``--checkpoint-every`` steps it saves one. A checkpoint is complete once
rank 0 has written the ``latest`` marker, which happens after ``dcp.save``
returned on every rank, so a rank killed mid-save leaves the previous one in
force. A restarted job (torchrun restarts every rank after one dies) thus
resumes at the step after the last complete checkpoint.

After every step it also asks whether the job is being preempted
(:mod:`.preemption`: SIGTERM, agreed across ranks); if so it saves a checkpoint
at that step and the ranks exit, to resume from it when the job runs again.

Resumed runs match uninterrupted ones when each step's randomness comes from
the step number (e.g. ``torch.Generator().manual_seed(step)``), since the
checkpoint holds model and optimizer state, not every RNG.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from . import env, preemption
from .metrics import set_progress

LATEST = "latest"
KEEP = 2


def directory() -> str | None:
    return env.get(env.CHECKPOINT_DIR) or None


def _every(every: int | None) -> int:
    if every is not None:
        return every
    return int(env.get(env.CHECKPOINT_EVERY, "0") or 0)


def latest_step(root: str | None = None) -> int | None:
    root = root or directory()
    try:
        with open(os.path.join(root, LATEST)) as f:
            return int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:08d}")


class _State:
    """Adapts a dict of modules, optimizers and stateful objects to DCP's Stateful."""

    def __init__(self, objects: dict):
        self.objects = objects

    def _split(self):
        import torch

        models = {k: v for k, v in self.objects.items() if isinstance(v, torch.nn.Module)}
        optims = {k: v for k, v in self.objects.items() if isinstance(v, torch.optim.Optimizer)}
        others = {k: v for k, v in self.objects.items() if k not in models and k not in optims}
        return models, optims, others

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        models, optims, others = self._split()
        out = {f"model.{k}": get_model_state_dict(m) for k, m in models.items()}
        model = next(iter(models.values()), None)
        for k, o in optims.items():
            out[f"optim.{k}"] = get_optimizer_state_dict(model, o)
        for k, o in others.items():
            out[f"other.{k}"] = o.state_dict()
        return out

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        models, optims, others = self._split()
        for k, m in models.items():
            set_model_state_dict(m, sd[f"model.{k}"])
        model = next(iter(models.values()), None)
        for k, o in optims.items():
            set_optimizer_state_dict(model, o, sd[f"optim.{k}"])
        for k, o in others.items():
            o.load_state_dict(sd[f"other.{k}"])


def save(ctx, step: int, state: dict, root: str | None = None) -> str:
    """Save ``state`` as the checkpoint after ``step`` steps; return its directory."""
    import torch.distributed.checkpoint as dcp

    root = root or directory()
    path = _step_dir(root, step)
    dcp.save({"app": _State(state)}, checkpoint_id=path)
    ctx.barrier()  # every rank's shard is on disk before the marker says so
    if ctx.rank == 0:
        tmp = os.path.join(root, f".{LATEST}.tmp")
        with open(tmp, "w") as f:
            json.dump({"step": step, "time": time.time()}, f)
        os.replace(tmp, os.path.join(root, LATEST))
        old = sorted(d for d in os.listdir(root) if d.startswith("step_"))[:-KEEP]
        for d in old:
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    return path


def load(ctx, state: dict, root: str | None = None) -> int | None:
    """Load the newest complete checkpoint into ``state``; return its step (or None)."""
    root = root or directory()
    step = latest_step(root) if root else None
    if step is None:
        return None
    import torch.distributed.checkpoint as dcp  # slow to import; only when there is one

    dcp.load({"app": _State(state)}, checkpoint_id=_step_dir(root, step))
    return step


def _event(message: str) -> None:
    job_dir = env.get(env.JOB_DIR)
    if job_dir:
        with open(os.path.join(job_dir, "events.log"), "a") as f:
            f.write(message + "\n")


def resume_range(ctx, total_steps: int, state: dict, every: int | None = None):
    """Yield the steps still to run, resuming from and saving checkpoints."""
    every = _every(every)
    root = directory()
    start = 0
    if root:
        os.makedirs(root, exist_ok=True)
        loaded = load(ctx, state, root)
        if loaded is not None:
            start = loaded
        if ctx.restart and ctx.rank == 0:
            where = (
                f"checkpoint at step {start}"
                if loaded is not None
                else "the start (no checkpoint yet)"
            )
            _event(f"restart {ctx.restart}: a rank stopped; every rank restarted from {where}")
        elif loaded is not None and ctx.rank == 0:
            _event(f"resumed from the checkpoint at step {start}")
    preemption.resumable(ctx, start)
    for step in range(start, total_steps):
        set_progress(step, total_steps)
        yield step
        done = step + 1
        saved = False
        if root and every and (done % every == 0 or done == total_steps):
            save(ctx, done, state, root)
            saved = True
        if done < total_steps and preemption.agreed(ctx):
            if root and not saved:
                save(ctx, done, state, root)
            preemption.record(ctx, done)
            if ctx.rank == 0:
                _event(preemption.stopped(done))
            raise preemption.Preempted(done)
    set_progress(total_steps, total_steps)
