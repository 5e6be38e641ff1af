"""``%deploy`` of LoRA adapters with their language model (magics/llm_adapters.py): a
PEFT model in the notebook or ``--adapter NAME=SOURCE`` become the archive's
``adapters/<name>/`` beside the base model, which is served without the LoRA
layers; the replica's loader then answers as the base and as each adapter, as
the notebook's models do. Real PEFT models trained here, a real IPython shell;
no service is reached (the gateway's test serves such an archive:
tests/service/test_openai_gateway.py)."""

from __future__ import annotations

import argparse
import io
import os
import tarfile

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from tiny_lm import tiny_llama, trained_lora

from gpulab.client.deployments import pack_model_dir
from gpulab.magics import llm_adapters
from gpulab.magics.llm_deploy import write_archive
from gpulab.serving.llm_export import load_causal_lm


def greedy(model, tokenizer, adapter=None) -> list[int]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello! How are you today?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    if adapter is not None:
        model.set_adapter(adapter)
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


ARGS = argparse.Namespace(name="chat", max_model_len=128, max_num_seqs=4)


def test_a_peft_model_deploys_its_base_and_its_adapter(tmp_path):
    lora = trained_lora()
    base, tok = tiny_llama()
    want_base, want_sql = greedy(base, tok), greedy(lora, tok)
    assert want_base != want_sql

    adapters = llm_adapters.sources({}, lora, [], str(tmp_path / "peft"))
    assert list(adapters) == ["default"]  # PEFT's name for an adapter not named
    served = llm_adapters.base_of(lora)
    assert not any("lora_" in k for k in served.state_dict())
    assert any("lora_" in k for k in lora.state_dict())  # the notebook's keeps its layers
    card = write_archive(served, tok, str(tmp_path / "model"), ARGS, adapters)
    assert card["adapters"] == ["default"]

    with tarfile.open(fileobj=io.BytesIO(pack_model_dir(str(tmp_path / "model")))) as tar:
        names = set(tar.getnames())
    assert {
        "adapters/default/adapter_config.json",
        "adapters/default/adapter_model.safetensors",
        "hf/model.safetensors",
    } <= names
    model, tokenizer, _ = load_causal_lm(str(tmp_path / "model"), device="cpu")
    assert greedy(model, tokenizer, "default") == want_sql
    with model.disable_adapter():
        assert greedy(model, tokenizer) == want_base


def test_adapter_flags_name_peft_models_and_saved_folders(tmp_path):
    lora = trained_lora()
    lora.save_pretrained(tmp_path / "saved")
    base, tok = tiny_llama()
    flags = llm_adapters.parse(["sql=lora", f"again={tmp_path / 'saved'}"])
    adapters = llm_adapters.sources({"lora": lora}, None, flags, str(tmp_path / "peft"))
    write_archive(base, tok, str(tmp_path / "model"), ARGS, adapters)
    model, tokenizer, card = load_causal_lm(str(tmp_path / "model"), device="cpu")
    assert card["adapters"] == ["again", "sql"]
    assert greedy(model, tokenizer, "sql") == greedy(model, tokenizer, "again")
    assert greedy(model, tokenizer, "sql") == greedy(lora, tok)
    assert sorted(os.listdir(tmp_path / "model" / "adapters" / "sql")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


@pytest.fixture
def shell(monkeypatch):
    # A service nobody answers at: every case must be refused before a call.
    monkeypatch.setenv("GPULAB_API_URL", "http://127.0.0.1:1/services/gpulab/api/v1")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "not-a-token")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    model, tok = tiny_llama()
    ip.user_ns.update(model=model, tok=tok)
    yield ip
    for name in ("model", "tok"):
        ip.user_ns.pop(name, None)


@pytest.mark.parametrize(
    "flags, message",
    [
        ("--adapter sql", "--adapter 'sql': give NAME=SOURCE"),
        ("--adapter s/ql=x", "the name 's/ql' must be letters"),
        ("--adapter sql=tok --adapter sql=tok", "--adapter sql is given twice"),
        ("--adapter sql=tok", "--adapter sql=tok: tok is a .*, not a PEFT model"),
        ("--adapter sql=/nowhere", "neither a variable nor a folder with adapter_config.json"),
    ],
)
def test_bad_adapter_flags_are_refused_in_the_magics_words(shell, flags, message):
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("deploy", f"model --name chat --tokenizer tok {flags}")
