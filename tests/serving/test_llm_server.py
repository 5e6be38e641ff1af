"""The model server as a real process on a small causal LM made here, called by the
real ``openai`` package (base_url at the replica, api_key = the serving token):
chat, streaming chat with usage, completions, stop strings, seeds, errors in
OpenAI's shape, a full server's 429, a disconnect freeing its slot, 8 streams at once."""

import json
import os
import re
import subprocess
import sys
import threading

import openai
import pytest
import requests
import torch
from support.model_server import ServerProcess
from tiny_lm import tiny_llama

from gpulab.serving.llm_export import load_causal_lm, save_causal_lm

TIMEOUT = 120  # seconds; a bound on every call, never a wait
TOKEN = "replica-secret"
HELLO = [{"role": "user", "content": "Hello! How are you today?"}]


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    """The tiny Llama, with a LoRA adapter ``sql`` (random, not zero, weights)."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_llama(max_position_embeddings=256)
    base, _ = tiny_llama(max_position_embeddings=256)  # the same weights (seeded)
    torch.manual_seed(5)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    sql = get_peft_model(base, config)
    path = str(tmp_path_factory.mktemp("llm"))
    save_causal_lm(
        model,
        tokenizer,
        path,
        max_model_len=256,
        max_num_seqs=4,
        name="chat",
        adapters={"sql": sql},
    )
    return path


def start(model_dir, *flags):
    os.environ["GPULAB_SERVING_TOKEN"] = TOKEN  # the replica reads it at start
    try:
        return ServerProcess(model_dir, *flags)
    finally:
        del os.environ["GPULAB_SERVING_TOKEN"]


#: Tokens a long answer asks for: seconds of work even for the tiny model, so a
#: sequence is still generating when the next request comes.
LONG = 1500


@pytest.fixture(scope="module")
def long_llm_dir(tmp_path_factory):
    """The same model with room for :data:`LONG` tokens."""
    model, tokenizer = tiny_llama(max_position_embeddings=2048)
    path = str(tmp_path_factory.mktemp("llm-long"))
    save_causal_lm(model, tokenizer, path, max_model_len=2048, max_num_seqs=4, name="chat")
    return path


@pytest.fixture(scope="module")
def servers(llm_dir, long_llm_dir):
    """``main``: 4 sequences at once, a context of 128 tokens (the command line
    lowers the card's 256); ``one``: one sequence (the command line overrides the
    card's 4), one waiting (429 and disconnect tests). Both start together."""
    procs = {
        "main": start(llm_dir, "--max-model-len", "128"),
        "one": start(long_llm_dir, "--max-num-seqs", "1", "--max-queue", "1"),
    }
    try:
        for p in procs.values():
            p.wait_listening()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def client(server, key=TOKEN):
    return openai.OpenAI(
        base_url=f"http://{server.url}/v1", api_key=key, timeout=TIMEOUT, max_retries=0
    )


@pytest.fixture(scope="module")
def main(servers):
    return servers["main"]


def greedy_chat(server, **kw):
    kw = {"max_tokens": 12, **kw}
    return client(server).chat.completions.create(
        model="alice/chat", messages=HELLO, temperature=0, **kw
    )


def test_save_and_load_keep_the_model_and_its_chat_template(llm_dir):
    assert set(os.listdir(os.path.join(llm_dir, "hf"))) >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    }
    assert not [f for f in os.listdir(os.path.join(llm_dir, "hf")) if f.endswith((".bin", ".pt"))]
    _, tokenizer, card = load_causal_lm(llm_dir)
    assert card["kind"] == "causal-lm" and card["max_model_len"] == 256
    assert card["chat_template"] is True and tokenizer.chat_template


def test_models_lists_the_served_model_and_its_adapters(main):
    model, adapter = client(main).models.list().data
    assert model.id == "chat" and model.max_model_len == 128 and model.max_num_seqs == 4
    assert model.engine.startswith("transformers continuous batching (CPU;")
    assert adapter.id == "chat:sql" and adapter.parent == "chat"


def test_a_lora_adapter_answers_as_its_own_model(main, llm_dir):
    peft, tokenizer, _ = load_causal_lm(llm_dir)
    ids = tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(ids, add_special_tokens=False, return_tensors="pt").input_ids
    expected = {}
    with torch.inference_mode():
        for adapter in (None, "sql"):
            if adapter is None:
                with peft.disable_adapter():
                    out = peft.generate(ids, max_new_tokens=12, do_sample=False)
            else:
                peft.set_adapter(adapter)
                out = peft.generate(ids, max_new_tokens=12, do_sample=False)
            expected[adapter] = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert expected[None] != expected["sql"]
    assert greedy_chat(main).choices[0].message.content == expected[None]
    answer = client(main).chat.completions.create(
        model="alice/chat:sql", messages=HELLO, max_tokens=12, temperature=0
    )
    assert answer.choices[0].message.content == expected["sql"]
    assert answer.model == "alice/chat:sql"
    with pytest.raises(openai.NotFoundError, match="'chat' has adapters sql"):
        client(main).chat.completions.create(model="chat:nope", messages=HELLO, max_tokens=2)


def test_a_context_longer_than_the_saved_one_is_refused_at_start(llm_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulab.serving.server",
            "--model-dir",
            llm_dir,
            "--port",
            "0",
            "--max-model-len",
            "4096",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 1
    assert "--max-model-len 4096 is above the 256 tokens 'chat' was saved with" in proc.stderr


def test_chat_answers_with_usage_and_echoes_the_model(main):
    answer = greedy_chat(main)
    assert answer.model == "alice/chat"
    assert answer.object == "chat.completion"
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert answer.usage.prompt_tokens > 0
    assert 0 < answer.usage.completion_tokens <= 12
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert choice.finish_reason == ("length" if answer.usage.completion_tokens == 12 else "stop")


def test_streaming_chat_gives_the_same_text_and_usage_last(main):
    whole = greedy_chat(main)
    chunks = list(greedy_chat(main, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    *text_chunks, usage_chunk = chunks
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage
    text = "".join(c.choices[0].delta.content or "" for c in text_chunks)
    assert text == whole.choices[0].message.content
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in text_chunks)


def test_stream_without_include_usage_has_no_usage_chunk(main):
    chunks = list(greedy_chat(main, stream=True))
    assert all(c.choices and c.usage is None for c in chunks)


def test_completion_of_a_prompt_and_seeded_sampling_repeats(main):
    c = client(main)
    greedy = c.completions.create(
        model="chat", prompt="The quick brown", max_tokens=8, temperature=0
    )
    assert greedy.object == "text_completion" and greedy.usage.completion_tokens == 8
    seeded = [
        c.completions.create(
            model="chat", prompt="The quick brown", max_tokens=8, temperature=1.0, top_p=0.9, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]


def test_a_stop_string_ends_the_text_before_it(main):
    full = greedy_chat(main).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    answer = greedy_chat(main, stop=[stop])
    assert answer.choices[0].message.content == full[: full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or "" for c in greedy_chat(main, stop=stop, stream=True)
    )
    assert streamed == full[: full.index(stop)]


def test_a_wrong_api_key_is_refused(main):
    with pytest.raises(openai.AuthenticationError):
        client(main, key="not-the-token").models.list()


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role 'wizard' is unknown"),
        ({"messages": "hi"}, "'messages' must be a non-empty list"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": 3}]}, "content must be a string"),
        ({"messages": HELLO, "max_tokens": 10_000}, "maximum context length is 128 tokens"),
        ({"messages": HELLO, "max_tokens": 0}, "'max_tokens' must be an integer >= 1"),
        ({"messages": HELLO, "n": 1000}, "'n' must be 1"),
        ({"messages": HELLO, "temperature": 7}, "'temperature' must be a number from 0 to 2"),
        ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "'stop' must be"),
        (
            {"messages": [{"role": "user", "content": "word " * 400}]},
            "maximum context length is 128 tokens; the prompt has",
        ),
    ],
)
def test_bad_chat_requests_get_400_in_openai_shape(main, body, words):
    r = requests.post(
        f"http://{main.url}/v1/chat/completions",
        json={"model": "chat", **body},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert words in error["message"]


@pytest.mark.parametrize(
    "data, words",
    [(b"\xff\xfe{}", "not UTF-8"), (b"{not json", "not JSON"), (b"[1]", "a JSON object")],
)
def test_unreadable_bodies_get_400(main, data, words):
    r = requests.post(
        f"http://{main.url}/v1/completions",
        data=data,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 400 and words in r.json()["error"]["message"]


def test_the_sdk_raises_bad_request_for_a_prompt_over_the_context(main):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 128"):
        client(main).completions.create(model="chat", prompt="word " * 400, max_tokens=4)


def test_eight_streams_at_once_all_complete_with_the_same_text(main):
    alone = greedy_chat(main, max_tokens=16).choices[0].message.content
    texts, errors = [None] * 8, []

    def stream(i):
        try:
            chunks = greedy_chat(main, max_tokens=16, stream=True)
            texts[i] = "".join(c.choices[0].delta.content or "" for c in chunks)
        except Exception as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors
    # Batched with others (4 at a time, the rest joining as slots free), each stream
    # says what the model says alone: padding and late joins do not change the text.
    assert texts == [alone] * 8


def metric(server, name):
    text = requests.get(
        f"http://{server.url}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=TIMEOUT,
    ).text
    return float(re.search(re.escape(name) + r"\{[^}]*\} (\S+)", text).group(1))


def open_stream(server, max_tokens):
    """A streaming chat left open after its first event (the role: it was admitted)."""
    r = requests.post(
        f"http://{server.url}/v1/chat/completions",
        json={
            "model": "chat",
            "messages": HELLO,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {TOKEN}"},
        stream=True,
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    lines = r.iter_lines()
    first = next(line for line in lines if line)
    assert json.loads(first.removeprefix(b"data: "))["choices"][0]["delta"]["role"] == "assistant"
    r.lines = lines  # held: a dropped line iterator closes the response
    return r


@pytest.fixture(scope="module")
def one(servers):
    one = servers["one"]
    # Alone, this model writes all LONG tokens (no end-of-sequence stops it early).
    assert greedy_chat(one, max_tokens=LONG).usage.completion_tokens == LONG
    return one


def test_a_full_server_answers_429_in_openai_shape(one):
    running = open_stream(one, LONG)
    waiting = open_stream(one, LONG)
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            greedy_chat(one)
        assert refused.value.response.headers["Retry-After"] == "1"
        assert "retry shortly" in refused.value.body["message"]
    finally:
        running.close()
        waiting.close()


def test_a_client_that_disconnects_frees_its_slot(one):
    wait_idle(one)
    before = metric(one, "gpulab_serving_generated_tokens")
    open_stream(one, LONG).close()  # gone after the first event
    wait_idle(one)
    # Cancelled at the engine's next step: far fewer than the tokens asked for.
    assert metric(one, "gpulab_serving_generated_tokens") - before < LONG / 2
    answer = greedy_chat(one)  # the slot is free for the next caller
    assert answer.usage.completion_tokens > 0


def wait_idle(server):
    """Until the engine has no sequence (a cancelled or a finished one both end)."""
    import time

    deadline = time.monotonic() + TIMEOUT
    while metric(server, "gpulab_serving_queue_depth") > 0:
        assert time.monotonic() < deadline, "the engine kept a sequence"
        time.sleep(0.05)


def test_a_client_that_leaves_before_a_whole_answer_frees_its_slot(one):
    """No stream: nothing is written until the end, so only the closed connection
    itself can tell the server that nobody waits for the answer."""
    import http.client

    wait_idle(one)
    before = metric(one, "gpulab_serving_generated_tokens")
    host, port = one.url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    body = {"model": "chat", "messages": HELLO, "max_tokens": LONG, "temperature": 0}
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    wait_for(lambda: metric(one, "gpulab_serving_queue_depth") == 1)  # it is generating
    conn.close()
    wait_idle(one)
    assert metric(one, "gpulab_serving_generated_tokens") - before < LONG / 2


def wait_for(condition):
    import time

    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)
