"""A caller that stops reading a streamed answer (its receive window shut) held its
stream slot and a replica's pooled connection for good: each write to it now waits at
most ``WRITE_TIMEOUT_S``, then the call ends as if the caller had gone (the gateway's
relay then counts what was sent and frees the slot)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from tornado import iostream

from gpulab.service.api.openai_v1 import TornadoReply
from gpulab.service.endpoints import openai_gateway
from gpulab.service.endpoints.router import AiohttpReply


class Closed:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def never() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()  # a write the caller never takes


async def test_an_aiohttp_caller_that_reads_nothing_is_let_go(monkeypatch):
    monkeypatch.setattr(openai_gateway, "WRITE_TIMEOUT_S", 0.05)
    transport = Closed()
    reply = AiohttpReply(SimpleNamespace(transport=transport))
    reply.response = SimpleNamespace(write=lambda data: never())
    with pytest.raises(ConnectionResetError, match="read nothing"):
        await reply.write(b"data: {}\n\n")
    assert transport.closed


async def test_a_tornado_caller_that_reads_nothing_is_let_go(monkeypatch):
    monkeypatch.setattr(openai_gateway, "WRITE_TIMEOUT_S", 0.05)
    connection = Closed()
    handler = SimpleNamespace(
        write=lambda data: None,
        flush=never,
        request=SimpleNamespace(connection=connection),
    )
    with pytest.raises(iostream.StreamClosedError):
        await TornadoReply(handler).write(b"data: {}\n\n")
    assert connection.closed
