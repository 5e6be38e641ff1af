"""A user's server answers the service's activity calls, and its owner controls what it
says (a handler in ``~/.jupyter`` will do): whatever comes back, it is that server's
refusal, never an error that ends the pass over everyone's servers (which the
scheduler runs before it preempts or hibernates anything)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
import tornado.httpserver
import tornado.web
from support.clock import fake_clock
from support.service import running_service
from test_hibernations_service import FakeServer, start_server
from tornado.testing import bind_unused_port

from gpulab.service.hibernation.manager import RETRY_AFTER_FAILURE_S
from gpulab.service.hibernation.servers import ServerCalls, ServerRefused

ANSWERS = [
    (b"<html>not json</html>", "not JSON"),
    (b'{"x": 1}', "not a list of kernels"),
    (b"[1, 2]", "not a list of kernels"),
]


class FakeHub:
    """The hub as ServerCalls uses it: alice's server runs, tokens are given out."""

    async def user_servers(self, user):
        now = dt.datetime.now(dt.UTC).isoformat()
        return {"": {"ready": True, "url": f"/user/{user}/", "started": now}}

    async def server_token(self, user, server, grace):
        return "a-token", "a-token-id"

    async def revoke_server_token(self, token_id):
        pass


@pytest.fixture
async def server():
    """A server whose ``api/kernels`` says what the test sets in ``answer``."""
    said = {"kernels": b"[]"}

    class Kernels(tornado.web.RequestHandler):
        def get(self):
            self.write(said["kernels"])

    class Activity(tornado.web.RequestHandler):
        def get(self):
            self.write(b'{"work": "not a list", "terminals_last_activity": 12}')

    app = tornado.web.Application(
        [(r"/user/alice/api/kernels", Kernels), (r"/user/alice/gpulab/activity", Activity)]
    )
    sock, port = bind_unused_port()
    http = tornado.httpserver.HTTPServer(app)
    http.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{port}", said
    finally:
        http.stop()


async def test_an_answer_of_any_shape_is_the_servers_refusal(server):
    url, said = server
    calls = ServerCalls(FakeHub(), url)
    for body, why in ANSWERS:
        said["kernels"] = body
        with pytest.raises(ServerRefused, match=why):
            await calls.activity("alice", "")
    # Odd fields inside a kernel list count as unknown, not as errors.
    said["kernels"] = b'[{"execution_state": 3, "last_activity": 5}, {"last_activity": "soon"}]'
    activity, _ = await calls.activity("alice", "")
    assert (activity.kernels, activity.busy, activity.last_activity) == (2, 0, None)
    assert activity.work == ()


class Broken(FakeServer):
    """bob's server makes the call fail in a way nobody planned for."""

    async def activity(self, user, server):
        if user == "bob":
            raise AttributeError("'int' object has no attribute 'get'")
        return await super().activity(user, server)


async def test_one_servers_failure_leaves_the_others_found_idle(tmp_path):
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc") as svc:
            fake = svc.app.hibernations.servers = Broken(clock)
            for user in ("alice", "bob"):
                await start_server(svc, user)
            fake.idle_s = {"alice/": 700, "bob/": 700}
            idle = await svc.app.hibernations.idle_servers(600)
            assert [s.owner for s in idle] == ["alice/"]


class Hanging(FakeServer):
    """bob's server takes its time answering (as long as the service would wait)."""

    async def activity(self, user, server):
        if user == "bob":
            await asyncio.sleep(3600)
        return await super().activity(user, server)


async def test_a_server_that_hangs_is_left_awake_without_holding_the_queue(tmp_path):
    """Preemption asks about idle servers with the job queue's lock held: a server that
    never answers must not hold every job's start and cancel with it."""
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc") as svc:
            hibernations = svc.app.hibernations
            fake = hibernations.servers = Hanging(clock)
            for user in ("alice", "bob"):
                await start_server(svc, user)
            fake.idle_s = {"alice/": 700, "bob/": 700}
            started = time.monotonic()
            idle = await hibernations.idle_servers(600, timeout=0.5)
            assert [s.owner for s in idle] == ["alice/"]
            assert time.monotonic() - started < 30
            # Not asked again for a while: the next pass does not wait for it.
            fake.activity = FakeServer.activity.__get__(fake)
            assert [s.owner for s in await hibernations.idle_servers(600)] == ["alice/"]
            clock.advance(RETRY_AFTER_FAILURE_S)
            owners = sorted(s.owner for s in await hibernations.idle_servers(600))
            assert owners == ["alice/", "bob/"]
