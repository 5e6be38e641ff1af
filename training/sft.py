"""A LoRA fine-tune on chat examples, inside a gpulab job: what a job of the
fine-tuning API (``POST <hub>/services/gpulab/v1/fine_tuning/jobs``) runs.

The service ships the base model's Hugging Face folder and the training file (a
JSONL of ``{"messages": [...]}``, checked before the job was queued) as the job's
variables; :func:`lora_sft` trains a PEFT LoRA adapter on every linear layer,
the loss taken on the assistant's turns only, reports the loss of each step
(``report(loss=...)``: the job's metrics, the fine-tuning job's events), and
writes the adapter to the job's ``out/`` (``adapter_config.json``,
``adapter_model.safetensors``; ``sft.json`` with the tokens trained on), where
the service picks it up and serves it on the base endpoint.

Only rank 0 trains: an adapter of this size needs one slice, and a job asked for
more ranks would train the same thing twice.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile

from . import env
from .metrics import report, set_progress

#: The learning rate a multiplier of 1 means (LoRA's usual rate).
BASE_LEARNING_RATE = 2e-4
DEFAULT_EPOCHS = 3
DEFAULT_BATCH = 4
LORA_RANK = 8
#: Where the service looks for the adapter (in the job's ``out/``).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SUMMARY_FILE = "sft.json"


def _write_folder(files: dict[str, bytes], folder: str) -> None:
    for rel, data in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def examples(jsonl: bytes) -> list[list[dict]]:
    """The conversations of a training file (the service checked its shape)."""
    out = []
    for line in jsonl.decode("utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line)["messages"])
    return out


def tokenize(tokenizer, messages: list[dict], max_len: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: the chat template's text, the labels -100 except on
    the assistant's replies (what the model should learn to say)."""
    ids: list[int] = []
    labels: list[int] = []

    def add(text: str, learn: bool) -> None:
        toks = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids.extend(toks)
        labels.extend(toks if learn else [-100] * len(toks))

    def template(msgs, prompt=False) -> str:
        if not msgs:
            return ""
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt)

    done = ""
    for i, m in enumerate(messages):
        full = template(messages[: i + 1])
        if m["role"] == "assistant":
            prompt = template(messages[:i], prompt=True)
            if not (prompt.startswith(done) and full.startswith(prompt)):
                ids, labels = [], []  # a template that is not built turn by turn: learn it all
                add(template(messages), True)
                break
            add(prompt[len(done) :], False)
            add(full[len(prompt) :], True)
        elif full.startswith(done):
            add(full[len(done) :], False)
        done = full
    return ids[:max_len], labels[:max_len]


def _batches(rows, batch_size: int, pad_id: int, rng: random.Random):
    import torch

    order = list(range(len(rows)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [rows[i] for i in order[start : start + batch_size]]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, (x, y) in enumerate(chunk):
            ids[r, : len(x)] = torch.tensor(x)
            labels[r, : len(y)] = torch.tensor(y)
            mask[r, : len(x)] = 1
        yield ids, labels, mask


def lora_sft(
    base_files: dict[str, bytes],
    training_jsonl: bytes,
    n_epochs: int = DEFAULT_EPOCHS,
    batch_size: int = DEFAULT_BATCH,
    learning_rate_multiplier: float = 1.0,
    seed: int = 0,
) -> dict:
    """Train a LoRA adapter of the model in ``base_files`` (``{path: bytes}`` of its
    Hugging Face folder) on ``training_jsonl``; the adapter goes to the job's ``out/``.
    Returns the summary it writes beside it."""
    if env.rank() != 0:
        return {}
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as base:
        _write_folder(base_files, base)
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            base, local_files_only=True, dtype=torch.float32
        )
    max_len = min(
        n
        for n in (
            getattr(model.config, "max_position_embeddings", None) or 4096,
            getattr(tokenizer, "model_max_length", None) or 4096,
            4096,
        )
        if isinstance(n, int)
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = [tokenize(tokenizer, m, max_len) for m in examples(training_jsonl)]
    rows = [r for r in rows if any(y != -100 for y in r[1])]
    if not rows:
        raise ValueError("no example has an assistant reply to learn from")
    lora = LoraConfig(
        r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, lora).to(device)
    model.train()
    lr = BASE_LEARNING_RATE * learning_rate_multiplier
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    per_epoch = math.ceil(len(rows) / batch_size)
    total = per_epoch * n_epochs
    rng = random.Random(seed)
    step, tokens = 0, 0
    for epoch in range(n_epochs):
        for ids, labels, mask in _batches(rows, batch_size, pad_id, rng):
            ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            step += 1
            tokens += int(mask.sum())
            set_progress(step, total)
            report(loss=float(loss.detach()), lr=lr, epoch=epoch + 1, samples=len(ids))
    summary = {"steps": step, "trained_tokens": tokens, "examples": len(rows)}
    out = os.path.join(env.get(env.JOB_DIR) or ".", "out")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in ADAPTER_FILES:
            shutil.copyfile(os.path.join(tmp, name), os.path.join(out, name))
    with open(os.path.join(out, SUMMARY_FILE), "w") as f:
        json.dump(summary, f)
    return summary
