"""``ctx.wrap(model, shard=True)``: a causal LM sharded with FSDP2 over two real ranks.

A rank killed with SIGKILL mid-run: torchrun restarts both, each loads its shard
of the last DCP checkpoint, and the run ends with the loss curve and weights of an
uninterrupted one. ``--out model`` then brings back the whole model, unsharded, as
the class the cell built (never "cannot pickle ProcessGroup"), and as a Hugging
Face folder with safetensors.
"""

import json
import os
import signal
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from localrun import new_spec, run, weights  # noqa: E402
from sharded_cells import SHARDED_LM  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 12
ENV = {"STEPS": str(STEPS), "STEP_DELAY": "0.3", "CHECKPOINTING": "1"}


def losses(jd) -> dict[int, float]:
    """Rank 0's loss per step, the last record of a step winning (replayed steps)."""
    records = [json.loads(ln) for ln in open(jd.p("metrics", "rank0.jsonl"))]
    return {r["step"]: r["loss"] for r in records}


def killed_and_resumed(
    backend, env: dict, steps: int, user: str | None = None, log_has=(), every: int = 4
):
    """A clean run, then the same job with rank 1 SIGKILLed between checkpoints (one
    every ``every`` steps): it resumes, and its loss curve and weights are the clean
    run's. The killed job's dir."""
    fields = dict(nproc_per_node=2, out="model", checkpoint_every=every, env=env, user=user)
    clean, clean_dir = run(backend, new_spec(SHARDED_LM, **fields))
    log = open(clean_dir.p("logs", "rank0.log")).read()
    assert clean.state == "succeeded", (clean, log[-3000:])
    for line in log_has:
        assert line in log, log[-3000:]

    spec = new_spec(SHARDED_LM, max_restarts=1, **fields)
    killed = {}

    def kill_rank_1_between_checkpoints():
        if killed:
            return
        jd = backend.jobdir(spec.id)
        try:
            latest = json.load(open(jd.p("checkpoints", "latest")))["step"]
            step = max(losses(jd))
        except (OSError, ValueError):
            return
        # A step past the checkpoint reported: the next one is under way.
        if latest >= every and step >= latest:
            pid = json.load(open(jd.p("pids", "rank1.json")))["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, at_step=step, checkpoint=latest)

    status, jd = run(backend, spec, on_tick=kill_rank_1_between_checkpoints)
    assert killed, "the job ended before a rank could be killed"
    assert status.state == "succeeded" and status.restarts == 1, status
    # Each rank holds half of every parameter: the checkpoint has a shard per rank.
    shards = os.listdir(jd.p("checkpoints", f"step_{steps:08d}"))
    assert sorted(s for s in shards if s.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    assert losses(jd) == losses(clean_dir)  # the same curve, step for step
    a, b = weights(clean_dir), weights(jd)
    assert a.keys() == b.keys() and "lm_head.weight" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    return jd


def test_a_sharded_lm_killed_mid_run_resumes_exactly_and_comes_back_whole(tmp_path):
    backend = LocalBackend(str(tmp_path / "jobs"))
    jd = killed_and_resumed(
        backend,
        ENV,
        STEPS,
        log_has=(
            "FSDP2 over 2 ranks, 2 blocks + embeddings and head + root",
            "parameters stay fp32 on cpu",
        ),
    )
    a = weights(jd)

    # --out: the whole model as the cell built it, on the CPU, no DTensor left.
    import cloudpickle
    from transformers import LlamaForCausalLM

    model = cloudpickle.loads(open(jd.p("out", "value.pkl"), "rb").read())
    assert type(model) is LlamaForCausalLM
    for name, p in model.named_parameters():
        assert type(p) is torch.nn.Parameter and p.device.type == "cpu", name
        assert torch.equal(p.data, a[name]), name
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(7))
    assert model(input_ids=ids).logits.shape == (1, 8, 256)  # buffers (rotary) came back too
    hf = LlamaForCausalLM.from_pretrained(jd.p("out", "hf"))
    assert os.path.exists(jd.p("out", "hf", "model.safetensors"))
    assert torch.equal(hf(input_ids=ids).logits, model(input_ids=ids).logits)


SHARDED_BY_FLAG = """
import torch
from gpulab.training import setup, checkpoint
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in checkpoint.resume_range(ctx, total_steps=3, state={"model": model, "opt": opt}):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * 10 + ctx.rank))
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_the_fsdp_flag_shards_what_ctx_wrap_gets_and_out_brings_it_back(tmp_path):
    from IPython.core.magic_arguments import parse_argstring

    from gpulab.backend.spec import JobSpec
    from gpulab.magics.train import TrainMagics, build_spec

    args = parse_argstring(TrainMagics.train_distributed, "--fsdp --nproc-per-node 2 --out model")
    fields = build_spec(args, SHARDED_BY_FLAG, {})
    assert fields["fsdp"] is True
    spec = new_spec(**{k: v for k, v in fields.items() if k in JobSpec.__dataclass_fields__})
    backend = LocalBackend(str(tmp_path / "jobs"))
    status, jd = run(backend, spec)
    log = open(jd.p("logs", "rank0.log")).read()
    assert status.state == "succeeded", (status, log[-3000:])
    assert "FSDP2 over 2 ranks, 0 blocks + root" in log
    import cloudpickle

    model = cloudpickle.loads(open(jd.p("out", "value.pkl"), "rb").read())
    assert type(model) is torch.nn.Sequential
    assert [type(p) for p in model.parameters()] == [torch.nn.Parameter] * 4
    assert not os.path.exists(jd.p("out", "hf"))  # only Hugging Face models get a folder
