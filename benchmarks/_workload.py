"""The small training job the overhead benchmarks time, and how they read its steps.

Rank 0 appends each step's wall-clock time to ``$BENCH_TIMES``, so every backend
is timed by the same code.
"""

from __future__ import annotations

from pathlib import Path

# The model, the optimizer and rank 0's file of step times: every workload's start.
_SETUP = """
import os, time, torch
from gpulab.training import setup, report, checkpoint
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                     torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                     torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = open(os.environ["BENCH_TIMES"], "a", buffering=1) if ctx.rank == 0 else None
"""
_STEPS = 'checkpoint.resume_range(ctx, total_steps=int(os.environ["BENCH_STEPS"]), state={"model": model})'
WORKLOAD = (
    _SETUP
    + f"for step in {_STEPS}:"
    + """
    g = torch.Generator().manual_seed(step * 2 + ctx.rank)
    x = torch.randn(256, 256, generator=g)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    report(loss=loss.item(), samples=256)
    if times:
        times.write(f"{time.time()}\\n")
"""
)
WARMUP = 10

# The same model over a dataset, as a fixed job reads it (a shuffled epoch, as a
# DistributedSampler gives it: each rank 256 of the step's 512 samples) and as an
# elastic one does (gpulab.training.batches: the same global batch at any size, here
# in one micro-batch of 256 per rank, as the fixed).
_DATA_WORKLOAD = (
    _SETUP
    + f"""X = torch.randn(65536, 256, generator=torch.Generator().manual_seed(1))
seen = None
for step in {_STEPS}:
    opt.zero_grad()
%s
    opt.step()
    report(loss=loss.item(), samples=256)
    if times:
        times.write(f"{{time.time()}}\\n")
"""
)
FIXED_DATA = (
    _DATA_WORKLOAD
    % """
    epoch, first = divmod(step * 512, len(X))
    if epoch != seen:
        order, seen = torch.randperm(len(X), generator=torch.Generator().manual_seed(epoch)), epoch
    mine = order[first + ctx.rank * 256 : first + (ctx.rank + 1) * 256]
    loss = model(X[mine]).pow(2).mean()
    loss.backward()"""
)
ELASTIC_DATA = (
    _DATA_WORKLOAD
    % """
    for mb in ctx.micro_batches(step, len(X), global_batch=512, micro_batch=256):
        with ctx.accumulating(model, mb):
            loss = model(X[mb.indices]).pow(2).mean() * mb.weight
            loss.backward()"""
)


def step_times(times_file: Path) -> tuple[list[float], list[float]]:
    """(each step's end, the gaps between steps after the first ``WARMUP``)."""
    stamps = [float(x) for x in times_file.read_text().split()]
    return stamps, [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]


# A causal LM (a Llama of 4 blocks, 13M parameters) sharded with FSDP2 per block by
# ctx.wrap(..., shard=True): the same script through gpulab and under plain torchrun.
FSDP_WORKLOAD = """
import os, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from gpulab.training import setup, report, checkpoint
ctx = setup()
torch.manual_seed(0)
config = LlamaConfig(hidden_size=256, num_hidden_layers=4, intermediate_size=688,
                     num_attention_heads=4, num_key_value_heads=4, vocab_size=2048,
                     max_position_embeddings=128)
model = ctx.wrap(LlamaForCausalLM(config), shard=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = open(os.environ["BENCH_TIMES"], "a", buffering=1) if ctx.rank == 0 else None
for step in checkpoint.resume_range(ctx, total_steps=int(os.environ["BENCH_STEPS"]), state={}):
    g = torch.Generator().manual_seed(step * 2 + ctx.rank)
    ids = torch.randint(0, 2048, (4, 64), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad(); loss.backward(); opt.step()
    report(loss=loss.item(), samples=4)
    if times:
        times.write(f"{time.time()}\\n")
"""
