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

# An elastic job's cell: the same global batch (32 samples) at any world size, split in
# micro-batches of 8 with gradient accumulation (gpulab.training.batches), in float64 so
# that runs at different sizes differ only by the order of additions. The loss reported
# is the global batch's (summed over the ranks).
ELASTIC = """
import os, time
import torch
import torch.distributed as dist
from gpulab.training import setup, report, checkpoint

torch.set_default_dtype(torch.float64)
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(7)
X = torch.randn(512, 8, generator=g)
Y = X @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
steps = int(os.environ.get("STEPS", "60"))
delay = float(os.environ.get("STEP_DELAY", "0"))
for step in checkpoint.resume_range(ctx, total_steps=steps, state={"model": model, "opt": opt}):
    opt.zero_grad()
    total = torch.zeros(1)
    for mb in ctx.micro_batches(step, len(X), global_batch=32, micro_batch=8):
        with ctx.accumulating(model, mb):
            loss = ((model(X[mb.indices]) - Y[mb.indices]) ** 2).mean() * mb.weight
            loss.backward()
        total += loss.detach()
    opt.step()
    if ctx.world_size > 1:
        dist.all_reduce(total)
    report(loss=total.item() / ctx.world_size, samples=32 // ctx.world_size)
    time.sleep(delay)
"""
