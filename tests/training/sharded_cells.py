"""A causal LM (a Llama built in code) trained with ``ctx.wrap(model, shard=True)``.

``SHARD=0`` runs the same job unsharded (DDP: every rank holds the whole model,
its gradients and Adam's state). Each step's tokens come from a generator seeded
by the step and rank, so a run resumed from a checkpoint sees the same batches as
an uninterrupted one.
"""

SHARDED_LM = """
import os, resource, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from gpulab.training import setup, report, checkpoint, memory

ctx = setup()
size = dict(hidden_size=int(os.environ.get("HIDDEN", "64")),
            num_hidden_layers=int(os.environ.get("LAYERS", "2")),
            intermediate_size=int(os.environ.get("FFN", "128")), num_attention_heads=4,
            num_key_value_heads=4, vocab_size=int(os.environ.get("VOCAB", "256")),
            max_position_embeddings=64)
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**size))
shard = os.environ.get("SHARD", "1") == "1"  # SHARD=0: the same job, DDP (each rank whole)
model = ctx.wrap(model, shard=shard, checkpointing=shard and bool(os.environ.get("CHECKPOINTING")))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = int(os.environ.get("STEPS", "12"))
delay = float(os.environ.get("STEP_DELAY", "0"))
for step in checkpoint.resume_range(ctx, total_steps=steps, state={"model": model, "opt": opt}):
    g = torch.Generator().manual_seed(1000 * step + ctx.rank)
    ids = torch.randint(0, size["vocab_size"], (2, 16), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    # What this rank may hold: its share of its node's memory cap (None: no cap).
    report(loss=loss.item(), cap_bytes=memory.cpu_cap()[0],
           params=sum(p.numel() for p in model.parameters()),
           peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    time.sleep(delay)
# Before --out gathers the whole model to rank 0: the optimizer's state is not needed.
del opt
model.zero_grad(set_to_none=True)
"""
