"""``%deploy`` of a language model, before anything is uploaded: which models take the
language-model route, and what the magic says for the wrong thing (its own flags'
words), in a real IPython shell with real transformers models and tokenizers. No
service is reached: every case here is refused in the kernel. The deploy itself is
tests/deploy/test_llm_deploy.py.
"""

from __future__ import annotations

import io
import tarfile

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from tiny_lm import tiny_llama

from gpulab.client.deployments import pack_model_dir
from gpulab.magics.llm_deploy import gateway_url, llm_usage_lines, wants_llm_route


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()


@pytest.fixture
def shell(monkeypatch, lm):
    # A service nobody answers at: every case must be refused before a call.
    monkeypatch.setenv("GPULAB_API_URL", "http://127.0.0.1:1/services/gpulab/api/v1")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "not-a-token")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    model, tok = lm
    ip.user_ns.update(model=model, tok=tok)
    yield ip
    for name in ("model", "tok", "bert", "net"):
        ip.user_ns.pop(name, None)


def deploy(ip, line):
    return ip.run_line_magic("deploy", line)


def test_a_causal_lm_takes_the_language_model_route(lm):
    import torch

    model, tok = lm
    ns = {"model": model, "tok": tok, "net": torch.nn.Linear(2, 2)}
    assert wants_llm_route(ns, "model", None)  # a causal LM object: no flag needed
    assert not wants_llm_route(ns, "net", None)  # a tensor model keeps torch.export
    assert wants_llm_route(ns, "net", "tok")  # --tokenizer asks for it (then refused)
    assert wants_llm_route(ns, "org/some-model", None)  # a Hugging Face id


def test_a_model_built_in_memory_needs_tokenizer(shell):
    with pytest.raises(UsageError, match="no tokenizer found for model; pass --tokenizer TOK"):
        deploy(shell, "model --name chat")


def test_a_model_that_is_not_a_causal_lm_is_refused_in_the_magics_words(shell):
    from transformers import BertConfig, BertModel

    shell.user_ns["bert"] = BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    with pytest.raises(UsageError, match=r"bert is a BertModel, not a causal language model"):
        deploy(shell, "bert --name chat --tokenizer tok")
    import torch

    shell.user_ns["net"] = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError, match="net is a Linear, not a transformers causal language"):
        deploy(shell, "net --name chat --tokenizer tok")


def test_tokenizer_that_is_not_one_and_example_with_a_language_model(shell):
    with pytest.raises(UsageError, match="--tokenizer model: is a LlamaForCausalLM, not a"):
        deploy(shell, "model --name chat --tokenizer model")
    with pytest.raises(UsageError, match="--example is for tensor models"):
        deploy(shell, "model --name chat --tokenizer tok --example x")
    with pytest.raises(UsageError, match="--max-num-seqs 0: give a positive number"):
        deploy(shell, "model --name chat --tokenizer tok --max-num-seqs 0")


def test_folders_and_ids_that_hold_no_model(shell, tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="MODEL '/nowhere/lm': no such folder"):
        deploy(shell, "/nowhere/lm --name chat")
    with pytest.raises(UsageError, match="folder has no Hugging Face model files"):
        deploy(shell, f"{tmp_path} --name chat")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(
        UsageError,
        match=r"MODEL 'nobody/no-such-model': not in the local Hugging Face cache "
        r"\(HF_HUB_OFFLINE is set: nothing is downloaded\)",
    ):
        deploy(shell, "nobody/no-such-model --name chat")


def test_a_saved_folder_brings_its_own_tokenizer(shell, lm, tmp_path):
    from gpulab.magics.llm_deploy import resolve_model, resolve_tokenizer

    model, tok = lm
    model.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")
    loaded = resolve_model({}, str(tmp_path / "saved"))
    assert loaded.can_generate() and loaded.config.hidden_size == model.config.hidden_size
    tok2 = resolve_tokenizer({}, None, str(tmp_path / "saved"), loaded)
    assert tok2("Hello!")["input_ids"] == tok("Hello!")["input_ids"]


def test_the_upload_carries_the_hugging_face_folder(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "model.json").write_text('{"kind": "causal-lm"}')
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / "hf" / name).write_text(name)
    (tmp_path / "hf" / "link.json").symlink_to(tmp_path / "model.json")
    with tarfile.open(fileobj=io.BytesIO(pack_model_dir(str(tmp_path)))) as tar:
        names = sorted(tar.getnames())
    assert names == ["hf/config.json", "hf/model.safetensors", "hf/tokenizer.json", "model.json"]


def test_printed_snippets_name_the_gateway_and_the_ca(monkeypatch):
    dep = {"name": "chat", "user": "alice"}
    base = gateway_url("https://hub.example:8443/services/gpulab/endpoints/alice/chat")
    assert base == "https://hub.example:8443/services/gpulab/v1"
    monkeypatch.setenv("GPULAB_CA_FILE", "/etc/gpulab/ca.pem")
    text = llm_usage_lines(dep, base, "chat")
    assert "OpenAI(base_url='https://hub.example:8443/services/gpulab/v1'," in text
    assert 'api_key=os.environ["JUPYTERHUB_API_TOKEN"]' in text
    assert 'curl --cacert "$GPULAB_CA_FILE" -H "Authorization: Bearer' in text
    assert "https://hub.example:8443/services/gpulab/v1/chat/completions" in text
    monkeypatch.delenv("GPULAB_CA_FILE")
    assert "--cacert" not in llm_usage_lines(dep, base.replace("https", "http"), "chat")


def test_a_context_longer_than_the_model_takes_is_refused_with_the_limit(shell):
    with pytest.raises(UsageError, match=r"--max-model-len 100000 must be between 1 and 256"):
        deploy(shell, "model --name chat --tokenizer tok --max-model-len 100000")
