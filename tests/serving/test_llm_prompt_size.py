"""A language model's replica refuses prompt text too long for its context before the
tokenizer or the chat template run: both run on the event loop, over a body of up to
16 MiB, and would stall every other request meanwhile.

The replica's OpenAI routes run in this process on the tiny tokenizer (a counting
wrapper says whether it ran); no engine is reached.
"""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp
import pytest
import tornado.web
from tiny_lm import tiny_tokenizer
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpulab.serving.openai_routes import CHARS_PER_TOKEN, LlmServer

CONTEXT = 16  # tokens
LIMIT = CONTEXT * CHARS_PER_TOKEN  # characters of prompt text


class CountingTokenizer:
    """The tiny tokenizer, counting what it is asked to do."""

    def __init__(self, tok):
        self.tok = tok
        self.chat_template = tok.chat_template
        self.eos_token_id = tok.eos_token_id
        self.runs = 0

    def __len__(self):
        return len(self.tok)

    def __call__(self, *args, **kw):
        self.runs += 1
        return self.tok(*args, **kw)

    def apply_chat_template(self, *args, **kw):
        self.runs += 1
        return self.tok.apply_chat_template(*args, **kw)


@pytest.fixture
async def replica():
    tokenizer = CountingTokenizer(tiny_tokenizer())
    engine = SimpleNamespace(load=0, tokens_made=0, max_num_seqs=1, max_queue=1)
    card = {"name": "chat", "max_model_len": CONTEXT}
    server = LlmServer(SimpleNamespace(), tokenizer, card, engine)
    server.ready = True
    sockets = bind_sockets(0, "127.0.0.1")
    http = HTTPServer(tornado.web.Application(server.routes()))
    http.add_sockets(sockets)
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}/v1", tokenizer
    finally:
        http.stop()
        await http.close_all_connections()


async def post(url: str, doc: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=doc) as r:
        return r.status, await r.json()


async def test_text_over_the_context_is_refused_before_the_tokenizer_runs(replica):
    v1, tokenizer = replica
    long = "hello " * (LIMIT // 6 + 1)  # just over the limit
    calls = [
        ("completions", {"model": "chat", "prompt": long}, "prompt"),
        (
            "chat/completions",
            {"model": "chat", "messages": [{"role": "user", "content": long}]},
            "messages",
        ),
        (  # the characters of all the messages together
            "chat/completions",
            {
                "model": "chat",
                "messages": [{"role": "user", "content": long[: LIMIT // 2 + 6]}] * 2,
            },
            "messages",
        ),
    ]
    for path, doc, param in calls:
        status, body = await post(f"{v1}/{path}", doc)
        assert status == 400, body
        error = body["error"]
        assert error["param"] == param and error["code"] == "context_length_exceeded"
        assert f"characters, over the {LIMIT} this model reads" in error["message"]
        assert f"its {CONTEXT}-token context); shorten it" in error["message"]
    assert tokenizer.runs == 0


async def test_text_within_the_bound_is_tokenized_and_judged_by_its_tokens(replica):
    v1, tokenizer = replica
    status, body = await post(f"{v1}/completions", {"model": "chat", "prompt": "hello " * 40})
    assert status == 400 and tokenizer.runs == 1
    assert "maximum context length is 16 tokens" in body["error"]["message"]
