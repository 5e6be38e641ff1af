"""The usage a language model's replica reports is charged to the caller (their token
limit, their usage rows), but the replica runs the endpoint owner's code: alice's
replica must not charge bob a billion tokens, nor break the count with a number too
large for a float. The gateway takes whole numbers above 0 only, at most the model's
context for the prompt and the call's max_tokens (else the context) for the completion.

The gateway runs in this process over the standby's call path (``TableCalls``) to a
replica stand-in on a Unix socket that answers whatever usage the test sets.
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from support.endpoint_rows import replica_on_socket, table_row

from gpulab.service.auth import Identity
from gpulab.service.endpoints.openai_gateway import OpenAIGateway
from gpulab.service.endpoints.standby import TableCalls
from gpulab.service.endpoints.token_meter import LlmLimits, TokenMeter

CONTEXT = 128
CARD = {"kind": "causal-lm", "max_model_len": CONTEXT}
BOB = Identity("bob", "user")
HUGE = 10**400  # past any float: prometheus_client's counters raised OverflowError


class CardCalls(TableCalls):
    def card(self, unit):
        return CARD


class Rows:
    """The token usage store and the threads that write to it, in one."""

    def __init__(self):
        self.rows: list[dict] = []

    def record_many(self, rows):
        self.rows += rows

    async def run(self, fn, *args):
        return fn(*args)


class Reply:
    def __init__(self):
        self.started, self.status, self.data = False, None, b""

    async def start(self, status, headers):
        self.started, self.status = True, status

    async def write(self, data):
        self.data += data


@pytest.fixture
async def replica(tmp_path):
    """Answers chat calls, whole or streamed, with ``usage["now"]`` as its usage
    (a JSON text, so any number can be sent)."""
    usage = {"now": "{}"}

    async def chat(request):
        doc = await request.json()
        text = '{"choices": [{"index": 0, "delta": {"content": "hi"}}]}'
        if not doc.get("stream"):
            body = '{"choices": [{"index": 0, "message": {"content": "hi"}}], "usage": %s}'
            return web.Response(text=body % usage["now"], content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {text}\n\n".encode())
        await resp.write(f'data: {{"choices": [], "usage": {usage["now"]}}}\n\n'.encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with replica_on_socket(app, str(tmp_path / "replica.sock")) as address:
        yield address, usage


@pytest.fixture
async def gateway(replica):
    calls = CardCalls()
    calls.load([table_row([[0, replica[0]]], name="chat", shares=["bob"])])
    rows = Rows()
    gateway = OpenAIGateway(calls, TokenMeter(LlmLimits(), store=rows, threads=rows))
    yield gateway, rows
    await calls.proxy.close()


async def chat(gateway, **body) -> Reply:
    reply = Reply()
    doc = {"model": "alice/chat", "messages": [{"role": "user", "content": "hi"}], **body}
    await gateway.answer(BOB, "POST", "chat/completions", json.dumps(doc).encode(), reply)
    return reply


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_reported_usage_is_held_to_the_context_and_max_tokens(gateway, replica, stream):
    gateway, rows = gateway
    _, usage = replica
    cases = [
        # (the replica's usage, the call's own fields, what bob is charged)
        ('{"prompt_tokens": 12, "completion_tokens": 5}', {"max_tokens": 20}, (12, 5)),
        ('{"prompt_tokens": 1000000000, "completion_tokens": 1000000000}', {}, (128, 128)),
        (
            '{"prompt_tokens": 1000000000, "completion_tokens": 1000000000}',
            {"max_tokens": 20},
            (128, 20),
        ),
        ('{"prompt_tokens": 1e9, "completion_tokens": 1e9}', {"max_completion_tokens": 7}, (0, 0)),
        (f'{{"prompt_tokens": {HUGE}, "completion_tokens": -5}}', {}, (128, 0)),
        ('{"prompt_tokens": true, "completion_tokens": "9"}', {}, (0, 0)),
    ]
    for reported, fields, charged in cases:
        usage["now"] = reported
        reply = await chat(gateway, stream=stream, **fields)
        assert reply.status == 200, reply.data
        await gateway.meter.flush()
        row = rows.rows[-1]
        assert (row["prompt_tokens"], row["completion_tokens"]) == charged, reported
    assert len(rows.rows) == len(cases)
    total = sum(p + c for _, _, (p, c) in cases)
    assert gateway.meter.used_last_minute("bob") == total  # what his token limit sees
