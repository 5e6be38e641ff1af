"""A Hugging Face ``Trainer`` script run unchanged in a two-rank job: its logged loss
reaches gpulab's metrics (what the live chart and ``GET /jobs/{id}/metrics`` read)
through ``gpulab.training.hf.GpulabCallback``, added without a line in the script."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from localrun import new_spec, run  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402

TRAINER = """
import os, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                     num_attention_heads=4, num_key_value_heads=4,
                                     vocab_size=128, max_position_embeddings=32))
g = torch.Generator().manual_seed(0)
rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (32, 16), generator=g)]
args = TrainingArguments(output_dir=os.environ["OUTPUT_DIR"], max_steps=6, logging_steps=2,
                         per_device_train_batch_size=4, learning_rate=1e-3, report_to=[],
                         save_strategy="no", use_cpu=True, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=rows).train()
"""


@pytest.mark.slow
def test_a_trainer_in_a_job_reports_its_loss_to_the_live_chart(tmp_path):
    backend = LocalBackend(str(tmp_path / "jobs"))
    env = {"OUTPUT_DIR": str(tmp_path / "trainer")}
    status, jd = run(backend, new_spec(TRAINER, nproc_per_node=2, env=env))
    log = open(jd.p("logs", "rank0.log")).read()
    assert status.state == "succeeded", (status, log[-3000:])
    records = [json.loads(ln) for ln in open(jd.p("metrics", "rank0.jsonl"))]
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == [2, 4, 6], records
    assert all(isinstance(r["loss"], float) and "learning_rate" in r for r in logged)
    assert all(r["total_steps"] == 6 and r["world_size"] == 2 for r in logged)
    assert any("train_runtime" in r for r in records)  # the Trainer's closing summary too


def test_the_callback_is_added_only_once_transformers_trainer_is_imported():
    """Importing gpulab's rank side never imports transformers (every job pays for it)."""
    code = (
        "import sys\n"
        "from gpulab.training import hf\n"
        "hf.add_when_imported(); hf.add_when_imported()\n"
        "assert 'transformers' not in sys.modules\n"
        "import transformers.trainer as t\n"
        "names = [c.__name__ for c in t.DEFAULT_CALLBACKS]\n"
        "assert names.count('GpulabCallback') == 1, names\n"
        "assert hf.GpulabCallback in t.DEFAULT_CALLBACKS\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
