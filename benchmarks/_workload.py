"""The small training job the overhead benchmarks time, and how they read its steps.

Rank 0 appends each step's wall-clock time to ``$BENCH_TIMES``, so every backend
is timed by the same code.
"""

from __future__ import annotations

from pathlib import Path

WORKLOAD = """
import os, time, torch
from gpulab.training import setup, report, checkpoint
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                     torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                     torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = open(os.environ["BENCH_TIMES"], "a", buffering=1) if ctx.rank == 0 else None
for step in checkpoint.resume_range(ctx, total_steps=int(os.environ["BENCH_STEPS"]), state={"model": model}):
    g = torch.Generator().manual_seed(step * 2 + ctx.rank)
    x = torch.randn(256, 256, generator=g)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    report(loss=loss.item(), samples=256)
    if times:
        times.write(f"{time.time()}\\n")
"""
WARMUP = 10


def step_times(times_file: Path) -> tuple[list[float], list[float]]:
    """(each step's end, the gaps between steps after the first ``WARMUP``)."""
    stamps = [float(x) for x in times_file.read_text().split()]
    return stamps, [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]
