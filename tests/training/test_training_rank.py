"""gpulab.training inside real ranks: report(), checkpoints, AMP and comm hooks."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from localrun import new_spec, run  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402
from gpulab.backend.spec import SpecError  # noqa: E402

ONE_PROCESS = """
import json, sys, torch
from gpulab.training import setup, report, checkpoint
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Linear(2, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
seen = []
state = {"model": model, "opt": opt}
for step in checkpoint.resume_range(ctx, total_steps=int(sys.argv[1]), state=state):
    seen.append(step)
    loss = model(torch.ones(1, 2)).pow(2).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    report(loss=loss, samples=1)
print(json.dumps({"seen": seen, "weight": model.weight.tolist(), "world": ctx.world_size,
                  "backend": ctx.backend, "device": str(ctx.device)}))
"""


def one_process(tmp_path, steps, **env):
    script = tmp_path / "train.py"
    script.write_text(ONE_PROCESS)
    out = subprocess.run(
        [sys.executable, str(script), str(steps)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_outside_a_job_it_runs_as_one_process_and_writes_nothing(tmp_path):
    result = one_process(tmp_path, 3)
    assert result["seen"] == [0, 1, 2] and result["world"] == 1
    assert result["device"] == "cpu" and result["backend"] == "gloo"
    assert os.listdir(tmp_path) == ["train.py"]


def test_checkpoints_resume_where_the_last_run_stopped(tmp_path):
    job = tmp_path / "job"
    env = {
        "GPULAB_JOB_DIR": str(job),
        "GPULAB_CHECKPOINT_DIR": str(job / "ckpt"),
        "GPULAB_CHECKPOINT_EVERY": "4",
    }
    first = one_process(tmp_path, 10, **env)
    assert first["seen"] == list(range(10))
    # Saved at 4, 8 and the end (10); the two newest are kept.
    assert sorted(os.listdir(job / "ckpt")) == ["latest", "step_00000008", "step_00000010"]
    second = one_process(tmp_path, 14, **env)
    assert second["seen"] == [10, 11, 12, 13]
    (tmp_path / "straight").mkdir()
    straight = one_process(tmp_path / "straight", 14)
    assert second["weight"] == straight["weight"]  # Adam's moments came back too
    records = [json.loads(ln) for ln in open(job / "metrics" / "rank0.jsonl")]
    assert [r["step"] for r in records] == list(range(14))
    assert records[-1]["total_steps"] == 14 and isinstance(records[0]["loss"], float)


HOOKED = """
import os, torch
from gpulab.training import setup, report, checkpoint
ctx = setup()
torch.manual_seed(0)
model = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = ctx.grad_scaler()
for step in checkpoint.resume_range(ctx, total_steps=12, state={"model": model, "opt": opt}):
    g = torch.Generator().manual_seed(step * 10 + ctx.rank)
    x = torch.randn(32, 8, generator=g)
    with ctx.autocast():
        out = model(x)
        dtype = out.dtype
    loss = (out.float() - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    report(loss=loss.item())
print("hook", model._get_ddp_logging_data().get("comm_hook"), "autocast", dtype, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "hook, amp, hook_name, dtype",
    [
        ("powersgd", "bf16", "powerSGD_hook", "torch.bfloat16"),
        ("fp16", "fp16", "fp16_compress_hook", "torch.float16"),
    ],
)
def test_comm_hooks_and_amp_run_on_gloo(tmp_path, hook, amp, hook_name, dtype):
    backend = LocalBackend(str(tmp_path / "jobs"))
    status, jd = run(backend, new_spec(HOOKED, nproc_per_node=2, comm_hook=hook, amp=amp))
    assert status.state == "succeeded", (status, open(jd.p("logs", "rank0.log")).read())
    log = open(jd.p("logs", "rank0.log")).read()
    assert f"hook {hook_name} autocast {dtype}" in log, log
    losses = [json.loads(ln)["loss"] for ln in open(jd.p("metrics", "rank0.jsonl"))]
    assert len(losses) == 12 and all(v == v for v in losses)  # finite, no NaN


def test_hooks_the_backend_cannot_run_are_refused_with_a_reason(tmp_path):
    cpu = LocalBackend(str(tmp_path / "jobs"))
    with pytest.raises(SpecError) as e:
        cpu.check(new_spec("x", nproc_per_node=2, comm_hook="bf16"))
    assert "bf16 needs NCCL" in str(e.value) and "use --comm-hook fp16 or powersgd" in str(e.value)
    cpu.check(new_spec("x", nproc_per_node=2, comm_hook="powersgd"))
    gpus = LocalBackend(str(tmp_path / "jobs"), real_gpus=True)
    gpus.check(new_spec("x", nproc_per_node=2, comm_hook="bf16", gpu_milli=500))
