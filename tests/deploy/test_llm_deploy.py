"""A language model end to end, as the issue's must-show: on the shared hub, alice
builds a small Llama and its tokenizer in her IPython kernel and ``%deploy``s it with
``--tokenizer``; a real replica serves it; the unmodified ``openai`` package streams
a chat completion through ``<hub>/services/gpulab/v1`` with her hub token; the curl
line the cell printed works as printed; ``/usage?unit=tokens`` counts the tokens;
bob gets 404 until she shares it. A deploy whose replicas cannot start raises in
the cell.

The model's weights are random (no weights can be downloaded here) but seeded, so
what the endpoint streams is checked against the same model's greedy ``generate``
in the kernel.
"""

import json
import re
import subprocess

import pytest
from hubproc import fresh_user
from support.wait import wait_until

pytestmark = pytest.mark.slow

BUILD = """
from tiny_lm import tiny_llama
model, tok = tiny_llama(seed=6)  # its greedy answer is 8 plain ASCII tokens, no end
"""
QUESTION = [{"role": "user", "content": "Hello! How are you today?"}]


def local_greedy(ns: dict, tokens: int) -> tuple[int, str]:
    """The prompt's length and the greedy completion the kernel's own model gives."""
    import torch

    model, tok = ns["model"], ns["tok"]
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    new = out[0, ids.shape[1] :]
    return ids.shape[1], tok.decode(new, skip_special_tokens=True)


def test_alice_deploys_a_language_model_and_streams_chat_with_openai(hub, monkeypatch):
    import openai
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from gpulab.client import Client

    alice, bob = fresh_user("alice"), fresh_user("bob")
    token = hub.create_user(alice)
    bob_token = hub.create_user(bob)
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    assert ip.run_cell(BUILD).success
    with capture_output() as out:
        ip.run_line_magic(
            "deploy", "model --name chat --tokenizer tok --max-model-len 128 --max-num-seqs 4"
        )
    printed = out.stdout
    base = f"{hub.url}/services/gpulab/v1"
    assert "saving model (causal LM, 0.1M parameters" in printed, printed
    assert "chat: running, 1/1 replica ready" in printed, printed
    assert f"OpenAI-compatible base URL: {base}" in printed, printed
    assert "model: chat " in printed and f"{alice}/chat" in printed

    # The unmodified openai package, streaming, with her hub token as the API key.
    client = openai.OpenAI(base_url=base, api_key=token)
    stream = client.chat.completions.create(
        model="chat",
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    prompt_len, expected = local_greedy(ip.user_ns, usage.completion_tokens)
    assert usage.prompt_tokens == prompt_len
    assert usage.completion_tokens == 8 and usage.total_tokens == prompt_len + 8
    assert text == expected  # the served model is hers, decoding greedily as generate does

    # The curl line runs as printed (bash, her token in the environment).
    curl = printed.split("curl:\n", 1)[1]
    run = subprocess.run(
        ["bash", "-c", curl],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "JUPYTERHUB_API_TOKEN": token},
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1

    # Usage counts the tokens of both calls, per user and model.
    rows = hub.gpulab("GET", "/usage?unit=tokens", token=token).json()["rows"]
    (mine,) = [r for r in rows if r["user"] == alice]
    assert mine["model"] == f"{alice}/chat" and mine["requests"] == 2, rows
    assert mine["prompt_tokens"] == prompt_len + answer["usage"]["prompt_tokens"], rows
    assert mine["completion_tokens"] == 8 + answer["usage"]["completion_tokens"], rows

    # Bob may not use it, until she shares it.
    as_bob = openai.OpenAI(base_url=base, api_key=bob_token)
    with pytest.raises(openai.NotFoundError, match=f"{alice}/chat"):
        as_bob.chat.completions.create(model=f"{alice}/chat", messages=QUESTION, max_tokens=4)
    Client().share_deployment("chat", share_users=[bob])
    reply = as_bob.chat.completions.create(
        model=f"{alice}/chat", messages=QUESTION, max_tokens=4, temperature=0
    )
    assert reply.usage.completion_tokens >= 1 and reply.choices[0].message.role == "assistant"

    # %deploy --list says it is a language model, the engine that serves it and why
    # (the service asks the replica once it is ready), and its tokens per second.
    dep = wait_until(
        lambda: (d := Client().get_deployment("chat")).get("engine") and d,
        "the service to learn the replica's engine",
    )
    # Completion tokens of the last minute (bob's reply just now among them).
    assert dep["tokens_per_second"] > 0, dep
    with capture_output() as out:
        ip.run_line_magic("deploy", "--list --once")
    assert re.search(r"language model · \d+\.\d tokens/s", out.stdout), out.stdout
    assert "engine: transformers continuous batching (CPU" in out.stdout, out.stdout

    with capture_output() as out:
        ip.run_line_magic("deploy", "--stop chat")
    assert "stopped chat" in out.stdout


LORA = """
from tiny_lm import tiny_llama, trained_lora
model, tok = tiny_llama()
sql_model = trained_lora()  # a PEFT LoRA adapter trained here on the same base
"""


def test_a_peft_model_deploys_as_its_base_and_its_adapter(hub, monkeypatch):
    """``%deploy`` of a PEFT model from the kernel: the base and the LoRA adapter
    answer as two models of one endpoint, each as the kernel's own model does."""
    import openai
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    dave = fresh_user("dave")
    token = hub.create_user(dave)
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    assert ip.run_cell(LORA).success
    with capture_output() as out:
        ip.run_line_magic("deploy", "sql_model --name sqlchat --tokenizer tok --max-model-len 128")
    assert "LoRA adapters, each a model of its own on the same replicas: sqlchat:default" in (
        out.stdout
    ), out.stdout
    client = openai.OpenAI(base_url=f"{hub.url}/services/gpulab/v1", api_key=token)
    assert [m.id for m in client.models.list().data] == ["sqlchat", "sqlchat:default"]
    answers = {
        model: client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=8, temperature=0
        )
        .choices[0]
        .message.content
        for model in ("sqlchat", "sqlchat:default")
    }
    ns = ip.user_ns
    assert answers["sqlchat:default"] == local_greedy({**ns, "model": ns["sql_model"]}, 8)[1]
    assert answers["sqlchat"] != answers["sqlchat:default"]
    with capture_output():
        ip.run_line_magic("deploy", "--stop sqlchat")


def test_a_language_model_whose_replicas_cannot_start_raises_in_the_cell(hub, monkeypatch):
    """Its weights file is cut short after saving: the replica cannot load it, and
    the cell raises DeploymentFailed with the replica's reason."""
    import os

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from gpulab.magics import llm_deploy
    from gpulab.magics.deploy_failure import DeploymentFailed

    carol = fresh_user("carol")
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.create_user(carol))
    write = llm_deploy.write_archive

    def cut_short(model, tokenizer, folder, args, *adapters):
        card = write(model, tokenizer, folder, args, *adapters)
        weights = os.path.join(folder, "hf", "model.safetensors")
        os.truncate(weights, os.path.getsize(weights) // 2)
        return card

    monkeypatch.setattr(llm_deploy, "write_archive", cut_short)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    assert ip.run_cell(BUILD).success
    with capture_output() as out, pytest.raises(DeploymentFailed) as failed:
        ip.run_line_magic("deploy", "model --name broken --tokenizer tok")
    assert "broken: the replicas did not start" in str(failed.value), str(failed.value)
    assert "broken: failed, 0/1 replica ready" in out.stdout, out.stdout
    ip.run_line_magic("deploy", "--stop broken")
