"""The bytes of endpoint calls one caller may keep in the service's memory at once.

A call's body (up to 256 MiB) is held from when it is read until it is answered, a
replica's answer (up to 256 MiB) until the caller has read it: six concurrent 200 MiB
answers added 1.9 GiB to the service. Each caller's calls together, and all callers',
are now held to a share (:mod:`gpulab.service.endpoints.call_bytes`); past it a call is
refused with a 429 and ``Retry-After``, and a caller that reads nothing of its answer
is hung up on after ``WRITE_TIMEOUT_S``.

Here the shares are a few MiB (the service's are 512 MiB and 2 GiB); the front doors
are the real endpoint router over the standby's call path and the service's own
endpoint route; a replica-like server on a Unix socket answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from support.endpoint_rows import replica_on_socket, table_row
from support.service import running_service

from gpulab.service.auth import Identity
from gpulab.service.endpoints import openai_gateway
from gpulab.service.endpoints.call_bytes import CallBytes
from gpulab.service.endpoints.router import EndpointRouter
from gpulab.service.endpoints.standby import TableCalls

MIB = 1 << 20
ALICE, BOB = Identity("alice", "user"), Identity("bob", "user")
ADMIN = Identity("root", "user", admin=True)
BIG_ANSWER = 32 * MIB


class Replica:
    """``.../slow`` answers once ``go`` is set (a body held meanwhile, as for a cold
    start), ``.../big`` answers BIG_ANSWER bytes, ``.../slowbig`` both, anything else
    at once."""

    def __init__(self):
        self.go = asyncio.Event()
        self.waiting = 0

    async def answer(self, request: web.Request) -> web.Response:
        await request.read()
        if request.path.endswith(("/slow", "/slowbig")):
            self.waiting += 1
            await self.go.wait()
        if request.path.endswith(("/big", "/slowbig")):
            return web.Response(body=b"x" * BIG_ANSWER, content_type="application/octet-stream")
        return web.json_response({"outputs": "ok"})


class StandInHub:
    access_scopes = {"access:services!service=gpulab"}

    async def user_for_token(self, token, use_cache=False, sync=False):
        return {"name": token.removesuffix("-token"), "kind": "user", "scopes": ["x"]}

    def check_scopes(self, required, model):
        return True


@contextlib.asynccontextmanager
async def endpoint_router(tmp_path, per_caller: int, total: int):
    """(alice's endpoint's URL on the router, the replica, the calls)."""
    replica = Replica()
    app = web.Application(client_max_size=64 * MIB)
    app.router.add_route("*", "/{tail:.*}", replica.answer)
    async with replica_on_socket(app, str(tmp_path / "replica.sock")) as address:
        calls = TableCalls()
        calls.load([table_row([[0, address]], name="chat", shares=["bob"])])
        calls.budget = CallBytes(per_caller=per_caller, total=total)

        async def identify(model):
            return {"alice": ALICE, "bob": BOB, "root": ADMIN}[model["name"]]

        router = EndpointRouter(
            calls,
            prefix="/services/gpulab/",
            max_upload_mib=8,
            identify=identify,
            hub_auth=StandInHub(),
        )
        runner = web.ServerRunner(web.Server(router.handle), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/services/gpulab/endpoints/alice/chat", replica, calls
        finally:
            replica.go.set()
            await runner.cleanup()
            await calls.proxy.close()


async def post(session, url: str, who: str, body) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"token {who}-token"}
    async with session.post(url, data=body, headers=headers) as r:
        data = await r.read()
        return r.status, dict(r.headers), data


async def until(check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def chunked(size: int):
    async def chunks():
        for _ in range(size // MIB):
            yield b"y" * MIB

    return chunks()


async def test_a_callers_bodies_are_held_to_their_share(tmp_path):
    """bob's 3 MiB call waits at the replica (or for a cold start): his second 3 MiB
    call would pass his 4 MiB share, so it is a 429 with Retry-After, sized or
    chunked; alice's goes on; once his first is answered his next one is taken."""
    async with (
        endpoint_router(tmp_path, per_caller=4 * MIB, total=64 * MIB) as (url, replica, calls),
        aiohttp.ClientSession() as session,
    ):
        first = asyncio.ensure_future(
            post(session, f"{url}/v2/models/chat/slow", "bob", b"a" * (3 * MIB))
        )
        await until(lambda: replica.waiting == 1)
        assert calls.budget.held["user:bob"] == 3 * MIB
        for body in (b"b" * (3 * MIB), chunked(3 * MIB)):
            status, headers, data = await post(session, f"{url}/v2/models/chat/infer", "bob", body)
            assert status == 429, data
            assert headers["Retry-After"] == "2"
            assert b"one caller may hold at once" in data
        status, _, _ = await post(session, f"{url}/v2/models/chat/infer", "alice", b"c" * 3 * MIB)
        assert status == 200
        replica.go.set()
        assert (await first)[0] == 200
        status, _, _ = await post(session, f"{url}/v2/models/chat/infer", "bob", b"d" * 3 * MIB)
        assert status == 200
        await until(lambda: calls.budget.in_all == 0 and not calls.budget.held)


async def test_all_callers_together_are_held_to_the_services_cap(tmp_path):
    """bob's and alice's bodies fill the service's share but for the room of their
    answers: the admin's call is refused until they are answered."""
    total = 6 * MIB + 100
    async with (
        endpoint_router(tmp_path, per_caller=4 * MIB, total=total) as (url, replica, calls),
        aiohttp.ClientSession() as session,
    ):
        held = [
            asyncio.ensure_future(post(session, f"{url}/v2/models/chat/slow", who, b"a" * 3 * MIB))
            for who in ("bob", "alice")
        ]
        await until(lambda: replica.waiting == 2)
        status, headers, data = await post(
            session, f"{url}/v2/models/chat/infer", "root", b" " * 1024
        )
        assert status == 429 and "Retry-After" in headers
        assert b"gpulab holds 6 MiB of endpoint calls now" in data
        replica.go.set()
        assert [(await h)[0] for h in held] == [200, 200]
        await until(lambda: calls.budget.in_all == 0)


def send_and_never_read(url: str, token: str) -> socket.socket:
    """A call whose caller never reads the answer (its receive window fills)."""
    host, _, rest = url.removeprefix("http://").partition("/")
    ip, port = host.split(":")
    sock = socket.create_connection((ip, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.sendall(
        f"GET /{rest}/v2/models/chat/big HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: token {token}\r\n\r\n".encode()
    )
    return sock


async def test_an_answer_counts_until_it_is_read_and_a_caller_that_never_reads_is_let_go(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(openai_gateway, "WRITE_TIMEOUT_S", 1.0)
    async with (
        endpoint_router(tmp_path, per_caller=40 * MIB, total=256 * MIB) as (url, _, calls),
        aiohttp.ClientSession() as session,
    ):
        stalled = send_and_never_read(url, "bob-token")
        try:
            # The router holds bob's 32 MiB answer while it cannot write it.
            await until(lambda: calls.budget.held["user:bob"] == BIG_ANSWER)
            started = time.monotonic()
            status, headers, data = await post(session, f"{url}/v2/models/chat/big", "bob", None)
            assert status == 429 and headers["Retry-After"] == "2", data[:200]
            assert b"one caller may hold at once" in data
            # A minute (here a second) without a byte read: hung up on, answer dropped.
            await until(lambda: not calls.budget.held, seconds=10)
            assert time.monotonic() - started < 8
        finally:
            stalled.close()
        status, _, data = await post(session, f"{url}/v2/models/chat/big", "bob", None)
        assert status == 200 and len(data) == BIG_ANSWER
        await until(lambda: calls.budget.in_all == 0)


@contextlib.asynccontextmanager
async def bobs_calls_on_the_services_route(tmp_path, replica: Replica):
    """alice's endpoint ``chat``, shared with bob, answered by ``replica`` through the
    service's own route (no router): (the call path, the URL, bob's headers)."""
    app = web.Application(client_max_size=64 * MIB)
    app.router.add_route("*", "/{tail:.*}", replica.answer)
    async with (
        replica_on_socket(app, str(tmp_path / "replica.sock")) as address,
        running_service(tmp_path / "svc") as svc,
    ):
        bob = svc.create_user("bob")
        svc.create_user("alice")
        calls = TableCalls()
        calls.load([table_row([[0, address]], name="chat", shares=["bob"])])
        calls.budget = CallBytes(per_caller=4 * MIB, total=64 * MIB)
        svc.app.deployments.calls = calls
        url = f"{svc.url}/services/gpulab/endpoints/alice/chat/v2/models/chat"
        try:
            yield calls, url, {"Authorization": f"token {bob}"}
        finally:
            replica.go.set()
            await calls.proxy.close()


async def test_the_services_own_endpoint_route_keeps_the_same_count(tmp_path):
    """Without the router (no proxy API), the service's route answers calls: bob's
    bodies there are held to his share too, and its 429 says when to try again."""
    replica = Replica()
    async with (
        bobs_calls_on_the_services_route(tmp_path, replica) as (calls, url, headers),
        aiohttp.ClientSession() as session,
    ):

        async def call(path: str, body) -> tuple[int, dict, bytes]:
            async with session.post(f"{url}/{path}", data=body, headers=headers) as r:
                return r.status, dict(r.headers), await r.read()

        first = asyncio.ensure_future(call("slow", b"a" * 3 * MIB))
        await until(lambda: replica.waiting == 1)
        assert calls.budget.held["user:bob"] == 3 * MIB
        for body in (b"b" * 3 * MIB, chunked(3 * MIB)):
            status, got, data = await call("infer", body)
            assert status == 429, data
            assert got.get("Retry-After") == "2"
            assert b"one caller may hold at once" in data
        replica.go.set()
        assert (await first)[0] == 200
        status, _, data = await call("big", b"{}")
        assert status == 200 and len(data) == BIG_ANSWER
        await until(lambda: not calls.budget.held)


async def test_a_call_whose_caller_went_away_leaves_nothing_counted(tmp_path):
    """bob hangs up while the replica works; its answer, read after that, was counted
    against him for good (every later call of his a 429, and everyone's past 2 GiB)."""
    replica = Replica()
    async with bobs_calls_on_the_services_route(tmp_path, replica) as (calls, url, headers):
        async with aiohttp.ClientSession() as session:
            gone = asyncio.ensure_future(
                session.post(f"{url}/slowbig", data=b"a" * MIB, headers=headers)
            )
            await until(lambda: replica.waiting == 1)
            gone.cancel()  # bob hangs up while the replica works
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        await until(lambda: not calls.budget.held)
        replica.go.set()  # the answer comes after he left
        await asyncio.sleep(1.0)
        assert not calls.budget.held and calls.budget.in_all == 0, calls.budget.held
        # His going away is not the replica's error (errors roll canaries back).
        units = [u for d in calls._deps.values() for u in d.units.values()]  # noqa: SLF001
        assert units and not any(u.traffic.errors_total for u in units)


@pytest.mark.parametrize("share", [4 * MIB])
def test_one_call_alone_always_fits_its_callers_share(share):
    """A body and an answer at their caps are one caller's share: a lone call is never
    refused for the caller's own bytes, only beside others of theirs."""
    budget = CallBytes(per_caller=share, total=100 * share)
    held = budget.hold("user:bob")
    held.add(share)  # its body
    held.add(share)  # and its answer: over the share, but the caller holds nothing else
    other = budget.hold("user:bob")
    with pytest.raises(Exception, match="one caller may hold at once"):
        other.add(1)
    held.release()
    other.add(share)
    other.release()
    assert budget.in_all == 0 and not budget.held
