"""Forwarding an endpoint call to a replica: the reverse proxy in front of deployments.

Connections to the replicas are kept alive (a new connection per call would
cost more than the call) and bodies pass through as they are, compressed or not.
Local replicas are reached on their Unix sockets (``unix:<path>``, which only
the service's account may connect to), a Kubernetes Service at its URL. The
caller's hub token never goes on: the replicas get their own secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import TypeVar

import aiohttp

from gpulab.backend.replica_http import ReplicaSessions
from gpulab.service.endpoints.call_bytes import Held, NoRoom

#: The longest one forwarded call may take.
CALL_TIMEOUT_S = 300
#: A streamed answer (a language model's tokens) may take longer as a whole; what
#: may not is a silence between two of its chunks.
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=CALL_TIMEOUT_S)


#: The most of one replica's answer the service holds whole: replicas run their
#: owner's code, and an answer of any size must not fill the service's memory.
MAX_ANSWER_BYTES = 256 << 20
T = TypeVar("T")


class AnswerTooLarge(Exception):
    """A replica's answer (or one event of its stream) passed what the service holds."""

    def __init__(self, limit: int):
        super().__init__(
            f"the replica's answer is over {limit / 2**20:g} MiB, more than gpulab "
            f"passes on; ask for less (a smaller batch, fewer tokens)"
        )


async def read_answer(
    resp: aiohttp.ClientResponse, limit: int | None = None, held: Held | None = None
) -> bytes | bytearray:
    """A replica's whole answer; AnswerTooLarge past ``limit`` bytes
    (:data:`MAX_ANSWER_BYTES` by default).

    With ``held`` (the call's bytes in the service's memory, :mod:`.call_bytes`) each
    byte is counted there as it is read (NoRoom past the caller's share), and the
    answer comes back as the bytearray it was read into: never copied, so it costs
    its size once. Without, as bytes."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    if resp.content_length is not None and resp.content_length > limit:
        raise AnswerTooLarge(limit)
    if held is not None and resp.content_length is not None:
        held.add(resp.content_length)  # refused before a byte of it is read
        counted = resp.content_length
    else:
        counted = 0
    data = bytearray()
    async for chunk in resp.content.iter_any():
        data += chunk
        if len(data) > limit:
            raise AnswerTooLarge(limit)
        if held is not None and len(data) > counted:
            held.add(len(data) - counted)
            counted = len(data)
    return data if held is not None else bytes(data)


#: Work over a body larger than this (parsing it) runs in a thread: a replica's answer
#: (its owner's code wrote it) may be up to MAX_ANSWER_BYTES, a call up to 16 MiB.
PARSE_ON_LOOP_BYTES = 1 << 20


async def off_loop_if_large(data: bytes, work: Callable[..., T], *args) -> T:
    """``work(*args)`` over ``data`` (an answer or a call's body): on the event loop
    when it is small (a thread costs more than parsing a few KiB), else in a thread."""
    if len(data) <= PARSE_ON_LOOP_BYTES:
        return work(*args)
    return await asyncio.to_thread(work, *args)


def forwarding_session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
        # No cookies kept between callers.
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


class EndpointProxy:
    def __init__(self):
        self._sessions = ReplicaSessions(forwarding_session, limit=512)

    async def forward(
        self,
        base: str,
        token: str,
        method: str,
        path: str,
        headers: dict,
        body: bytes | None,
        held: Held | None = None,
    ):
        """Send one call to the replica at ``base`` (``unix:<socket>`` or a URL):
        ``(status, reason, headers, body)``, or None when it refuses the connection
        (it just went away). An answer over :data:`MAX_ANSWER_BYTES` becomes a 502.
        ``held``: the call's bytes in memory, which its answer joins as it is read
        (:func:`read_answer`; NoRoom past the caller's share)."""
        headers = {**headers, "Authorization": f"Bearer {token}"}
        session, url = await self._sessions.get(base)
        try:
            async with session.request(method, f"{url}/{path}", headers=headers, data=body) as resp:
                try:
                    answer = await read_answer(resp, held=held)
                    return resp.status, resp.reason, resp.headers, answer
                except NoRoom:
                    resp.close()  # the rest is not read: the connection cannot be kept
                    raise
                except AnswerTooLarge as e:
                    resp.close()  # the rest is not read: the connection cannot be kept
                    error = json.dumps({"error": str(e)}).encode()
                    return 502, "Bad Gateway", {"Content-Type": "application/json"}, error
        except aiohttp.ClientConnectionError:
            return None

    @contextlib.asynccontextmanager
    async def open(
        self, base: str, token: str, method: str, path: str, headers: dict, body: bytes | None
    ):
        """Like :meth:`forward`, but the replica's answer is handed over open (an
        ``aiohttp.ClientResponse`` whose body is read as it comes: a stream of
        server-sent events), or None when the replica refuses the connection. Left
        before its end (the caller went away), the connection is closed, so the
        replica sees it and stops generating."""
        headers = {**headers, "Authorization": f"Bearer {token}"}
        session, url = await self._sessions.get(base)
        try:
            resp = await session.request(
                method, f"{url}/{path}", headers=headers, data=body, timeout=STREAM_TIMEOUT
            )
        except aiohttp.ClientConnectionError:
            resp = None
        if resp is None:
            yield None
            return
        try:
            yield resp
        finally:
            if resp.content.is_eof():
                resp.release()
            else:
                resp.close()

    async def close(self) -> None:
        await self._sessions.close()
