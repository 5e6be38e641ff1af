"""What the service holds of a replica's answer. Replicas run their owner's code (their
own Python environment), so an answer, or one event of a stream, may be any size: the
service holds a bounded amount and says so, rather than fill its memory.

A real aiohttp server in this process stands in for the replica.
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from gpulab.service.endpoints import proxy
from gpulab.service.endpoints.openai_gateway import MAX_EVENT_BYTES, SseRelay
from gpulab.service.endpoints.proxy import AnswerTooLarge, EndpointProxy


def chunk(text: str) -> bytes:
    doc = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def test_whole_events_pass_on_however_the_reads_cut_them():
    relay = SseRelay(keep_usage=False, started=0.0)
    stream = chunk("Hel") + chunk("lo") + b'data: {"usage": {"prompt_tokens": 3}}\n\n'
    stream += b"data: [DONE]\n\n"
    sent = b""
    for i in range(0, len(stream), 7):  # every cut, a separator's two bytes apart too
        sent += relay.feed(stream[i : i + 7])
    assert sent == chunk("Hel") + chunk("lo") + b"data: [DONE]\n\n"  # usage not asked for
    assert relay.usage == {"prompt_tokens": 3} and relay.content_chunks == 2
    assert relay.rest() == b""


def test_gaps_are_told_as_they_come_and_large_events_pass_unread():
    """A stream may be endless: nothing is kept per token (its gaps were a list read
    once the stream ended), and an event too big to be a token is not parsed."""
    gaps = []
    relay = SseRelay(keep_usage=True, started=0.0, on_gap=gaps.append)
    for n in range(1, 4):
        relay.feed(chunk("t"))
        assert len(gaps) == n - 1  # told at once
    assert not hasattr(relay, "gaps")
    big = {"choices": [{"delta": {"content": "x" * (100 << 10)}}]}
    event = b"data: " + json.dumps(big).encode() + b"\n\n"
    assert relay.feed(event) == event and relay.content_chunks == 3


def test_an_event_that_never_ends_is_cut_at_the_cap():
    relay = SseRelay(keep_usage=True, started=0.0)
    assert relay.feed(b"data: " + b"x" * (MAX_EVENT_BYTES - 100)) == b""
    with pytest.raises(AnswerTooLarge, match="over 1 MiB"):
        relay.feed(b"x" * 200)


@pytest.fixture
async def replica():
    """A stand-in replica: /big streams 2 MiB with no length, /sized declares 2 MiB."""

    async def big(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(32):
            await resp.write(b"z" * (64 << 10))
        return resp

    async def sized(request):
        return web.Response(body=b"z" * (2 << 20))

    async def small(request):
        return web.json_response({"outputs": [1, 2]})

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/sized", sized)
    app.router.add_get("/small", small)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_an_answer_over_the_cap_becomes_a_502_that_says_so(replica, monkeypatch):
    monkeypatch.setattr(proxy, "MAX_ANSWER_BYTES", 1 << 20)
    forwarding = EndpointProxy()
    try:
        for path in ("big", "sized"):
            status, _, _, body = await forwarding.forward(replica, "t", "GET", path, {}, None)
            assert status == 502, path
            assert json.loads(body)["error"].startswith("the replica's answer is over 1 MiB")
        status, _, _, body = await forwarding.forward(replica, "t", "GET", "small", {}, None)
        assert (status, json.loads(body)) == (200, {"outputs": [1, 2]})
    finally:
        await forwarding.close()


def test_json_nested_past_pythons_limit_is_read_as_not_json():
    """A caller's body is a 400 in OpenAI's shape; a replica's event or answer, or a
    user's server's, is passed on or refused as not JSON (RecursionError was a 500)."""
    from gpulab.service.endpoints.openai_errors import OpenAIError, as_openai
    from gpulab.service.endpoints.openai_gateway import _usage_of, parse_body

    deep = b"[" * 20_000 + b"]" * 20_000  # under the size of an event that is read
    with pytest.raises(OpenAIError) as refused:
        parse_body(b'{"model": "m", "x": ' + deep + b"}")
    assert refused.value.status == 400
    relay = SseRelay(keep_usage=False, started=0.0)
    assert relay.feed(b"data: " + deep + b"\n\n") == b"data: " + deep + b"\n\n"
    assert _usage_of(deep) is None
    assert b"error" in as_openai(500, deep)
