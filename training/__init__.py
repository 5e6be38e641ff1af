"""Code that runs inside a training rank (torch and the standard library only).

A ``%%train_distributed`` cell uses three names::

    from gpulab.training import setup, report, checkpoint
    ctx = setup()                      # process group, device, rank, world size
    model = ctx.wrap(Net())            # DDP on the right device (+ comm hook)
    for step in checkpoint.resume_range(ctx, total_steps=500, state={"model": model, "opt": opt}):
        ...
        report(loss=loss.item())

Outside a gpulab job (plain ``torchrun`` or ``python``) the same code runs:
``setup()`` reads torchrun's variables or falls back to one process, and
``report()`` writes only when ``GPULAB_JOB_DIR`` is set.
"""

from . import checkpoint
from .context import Context, setup
from .metrics import report

__all__ = ["Context", "checkpoint", "report", "setup"]
