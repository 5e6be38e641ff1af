"""Cells the job tests run: tiny models, few steps, deterministic per step.

Every step's data comes from a generator seeded by the step and rank, so a run
resumed from a checkpoint sees the same data as an uninterrupted one.
"""

LINEAR = """
import os, time
import torch
from gpulab.training import setup, report, checkpoint

ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
w_true = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
steps = int(os.environ.get("STEPS", "30"))
delay = float(os.environ.get("STEP_DELAY", "0"))
# FAST_ONCE_RESUMED: slow only until preempted; a run resumed from a checkpoint has
# nothing left to wait for.
fast_once_resumed = bool(os.environ.get("FAST_ONCE_RESUMED"))
first = None
for step in checkpoint.resume_range(ctx, total_steps=steps, state={"model": model, "opt": opt}):
    first = step if first is None else first
    if step == 5 and os.environ.get("GATE"):  # tests hold the job here until they say go
        while not os.path.exists(os.environ["GATE"]):
            time.sleep(0.2)
    g = torch.Generator().manual_seed(1000 * step + ctx.rank)
    x = torch.randn(16, 4, generator=g)
    loss = ((model(x) - x @ w_true.T) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    report(loss=loss.item(), lr=0.05, samples=16)
    if delay and not (fast_once_resumed and first > 0):
        time.sleep(delay)
print(f"rank {ctx.rank}/{ctx.world_size} done, loss {loss.item():.4f}")
"""

FAILS_ON_RANK_1 = """
from gpulab.training import setup
ctx = setup()
if ctx.rank == 1:
    raise ValueError("bad batch shape on purpose")
ctx.barrier()
"""

SLEEPS = """
import time
from gpulab.training import setup, report
ctx = setup()
for step in range(100000):
    time.sleep(0.2)
    report(step=step)
"""
