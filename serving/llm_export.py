"""A causal language model (transformers) as a model directory the server loads.

A causal LM is not traced with ``torch.export`` (its key/value cache is not a
tensor ``torch.export`` can carry, and its input length varies): its Hugging Face
folder travels as it is, under ``hf/`` beside the card ``model.json``:

* ``hf/config.json``, ``hf/generation_config.json``, ``hf/model.safetensors``
  (``save_pretrained(..., safe_serialization=True)``: no pickles);
* ``hf/tokenizer.json``, ``hf/tokenizer_config.json`` and the chat template.

The card says ``"kind": "causal-lm"`` and how the server may use the model:
``max_model_len`` (prompt and completion tokens together), ``max_num_seqs``
(sequences generating at once), ``dtype``, ``chat_template`` (whether the
tokenizer has one: chat completions need it) and ``adapters``: the names of LoRA
adapters (PEFT) saved under ``adapters/<name>/`` (``adapter_config.json``,
``adapter_model.safetensors``), served on the same replica as models of their
own. It also carries the fields every card has (``inputs``, ``outputs``,
``max_batch_size``), so the service's checks of an upload hold.

transformers is imported only when such a model is saved or loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from .export import CARD_FILE, ExportError

KIND = "causal-lm"
HF_DIR = "hf"
ADAPTERS_DIR = "adapters"
PLATFORM = "transformers"
#: Without a limit in the model's config: the longest context the server allows.
DEFAULT_MAX_MODEL_LEN = 2048


def is_causal_lm(model) -> bool:
    """Whether ``model`` is a transformers model that generates text."""
    return any(
        c.__module__.startswith("transformers") and c.__name__ == "GenerationMixin"
        for c in type(model).__mro__
    )


def _context_length(model, tokenizer) -> int:
    limits = [
        getattr(model.config, "max_position_embeddings", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    # A tokenizer without a limit says so with a huge number (int(1e30)).
    limits = [int(n) for n in limits if isinstance(n, int) and 0 < n < 10**7]
    return min(limits) if limits else DEFAULT_MAX_MODEL_LEN


def save_causal_lm(
    model,
    tokenizer,
    folder: str,
    max_model_len: int | None = None,
    max_num_seqs: int = 16,
    name: str | None = None,
    adapters: dict | None = None,
) -> dict:
    """Write ``model`` and ``tokenizer`` and their card into ``folder``; return the card.
    ``adapters``: ``{name: PEFT model or the folder its save_pretrained wrote}``, LoRA
    adapters of ``model`` served beside it."""
    if not is_causal_lm(model):
        raise ExportError(
            f"{type(model).__name__} is not a transformers causal language model "
            "(one with .generate, e.g. AutoModelForCausalLM.from_pretrained(...))"
        )
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise ExportError(
            "a causal language model needs its tokenizer: pass the transformers "
            "tokenizer (AutoTokenizer.from_pretrained(...)) with it"
        )
    limit = _context_length(model, tokenizer)
    if max_model_len is None:
        max_model_len = limit
    if not isinstance(max_model_len, int) or not 1 <= max_model_len <= limit:
        raise ExportError(
            f"max_model_len {max_model_len!r} must be between 1 and {limit}, "
            "the longest context the model takes"
        )
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ExportError(f"max_num_seqs {max_num_seqs!r} must be an integer >= 1")
    for adapter in adapters or {}:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", adapter):
            raise ExportError(
                f"adapter name {adapter!r}: use letters, digits, '.', '_' or '-' (at most 63)"
            )
    hf = os.path.join(folder, HF_DIR)
    os.makedirs(hf, exist_ok=True)
    model.save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    for adapter, source in (adapters or {}).items():
        _save_adapter(source, os.path.join(folder, ADAPTERS_DIR, adapter), adapter)
    card = {
        "name": name or "llm",
        "kind": KIND,
        "platform": PLATFORM,
        "version": "1",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "max_batch_size": max_num_seqs,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "dtype": str(model.dtype).removeprefix("torch."),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "adapters": sorted(adapters or {}),
        "requires": ["transformers"],
    }
    with open(os.path.join(folder, CARD_FILE), "w") as f:
        json.dump(card, f, indent=2)
    return card


def _save_adapter(source, dest: str, name: str) -> None:
    """A LoRA adapter's two files (config and safetensors weights) into ``dest``."""
    os.makedirs(dest, exist_ok=True)
    if isinstance(source, (str, os.PathLike)):
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            if not os.path.exists(os.path.join(source, f)):
                raise ExportError(
                    f"adapter {name!r}: {source} has no {f}; save the PEFT model with "
                    "save_pretrained(folder) (safetensors)"
                )
            shutil.copyfile(os.path.join(source, f), os.path.join(dest, f))
        return
    if not hasattr(source, "peft_config"):
        raise ExportError(f"adapter {name!r} is not a PEFT model or a folder one saved")
    with tempfile.TemporaryDirectory() as tmp:  # PEFT writes a sub-folder per adapter name
        source.save_pretrained(tmp, safe_serialization=True)
        _save_adapter(tmp, dest, name)


def read_card(folder: str) -> dict:
    path = os.path.join(folder, CARD_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing; save the model with "
            "gpulab.serving.llm_export.save_causal_lm(model, tokenizer, folder)"
        )
    with open(path) as f:
        return json.load(f)


def load_causal_lm(folder: str, device: str | None = None):
    """``(model, tokenizer, card)`` of a folder :func:`save_causal_lm` wrote."""
    card = read_card(folder)
    if card.get("kind") != KIND:
        raise ValueError(f"{folder} holds a {card.get('kind')!r} model, not a {KIND!r}")
    hf = os.path.join(folder, HF_DIR)
    if not os.path.exists(os.path.join(hf, "config.json")):
        raise FileNotFoundError(
            f"{hf}/config.json is missing; save the model with "
            "gpulab.serving.llm_export.save_causal_lm(model, tokenizer, folder)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # Every file is here: never ask the Hugging Face hub (a replica may not reach it).
    tokenizer = AutoTokenizer.from_pretrained(hf, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        hf, local_files_only=True, dtype=getattr(torch, card.get("dtype", "float32"))
    )
    adapters = card.get("adapters") or []
    if adapters:
        from peft import PeftModel

        path = os.path.join(folder, ADAPTERS_DIR)
        model = PeftModel.from_pretrained(
            model, os.path.join(path, adapters[0]), adapter_name=adapters[0]
        )
        for adapter in adapters[1:]:
            model.load_adapter(os.path.join(path, adapter), adapter_name=adapter)
    model.to(device).eval()
    return model, tokenizer, card
