"""What an endpoint URL forwards, and what its refusals tell whom.

- An endpoint URL (``<hub>/services/gpulab/endpoints/OWNER/NAME/...``) forwards only
  the Open Inference Protocol v2 routes: a language model's replica also serves
  OpenAI's ``v1/`` routes, which are the gateway's (it meters the tokens), so a
  ``v1/`` path, however it is spelled, is a 404 that names the gateway.
- A version's state message can hold its replicas' log tail (the owner's code and
  data): only the owner and admins read it in a refusal.

The call path is the standby's (``TableCalls``, the same code as the live one) and the
front door the real endpoint router, in this process; a replica-like server on a Unix
socket records what reaches it.
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from support.endpoint_rows import replica_on_socket, table_row
from yarl import URL

from gpulab.service.auth import Identity
from gpulab.service.endpoints.calls import ASK_THE_OWNER, CallRefused, LiveCalls
from gpulab.service.endpoints.live import LiveEndpoints
from gpulab.service.endpoints.proxy import EndpointProxy
from gpulab.service.endpoints.router import EndpointRouter
from gpulab.service.endpoints.standby import TableCalls

SECRET = "replica-secret"
LOG_TAIL = "Traceback ... KeyError: 'sk-live-alices-api-key'"
FAILED = f"replica 0 exited with code 1 (5 times in 300 s); slices released. Last log: {LOG_TAIL}"
ALICE, BOB = Identity("alice", "user"), Identity("bob", "user")
ADMIN = Identity("root", "user", admin=True)


def endpoint(ready, message="1/1 ready", state="running"):
    return table_row(ready, name="chat", shares=["bob"], message=message, state=state)


@pytest.fixture
async def replica(tmp_path):
    """A language model's replica stand-in: OIP v2 routes and OpenAI's; ``seen`` is
    every path that reached it."""
    seen: list[str] = []

    async def answer(request):
        seen.append(request.raw_path)
        return web.json_response({"outputs": "ok"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with replica_on_socket(app, str(tmp_path / "replica.sock")) as address:
        yield address, seen


@pytest.fixture
async def calls(replica):
    calls = TableCalls()
    calls.load([endpoint([[0, replica[0]]])])
    yield calls
    await calls.proxy.close()


V1_SPELLINGS = [
    "v1/chat/completions",
    "v1/completions",
    "v1/models",
    "v2/../v1/chat/completions",  # resolved by the client library before it is sent
    "%761/chat/completions",  # %76 is "v"
    "v2/%2e%2e/v1/chat/completions",
    "./v1/chat/completions",
]


@pytest.mark.parametrize("path", V1_SPELLINGS)
async def test_a_v1_path_is_refused_with_the_gateways_address(calls, replica, path):
    dep = calls.callable_endpoint(BOB, "alice", "chat")
    with pytest.raises(CallRefused) as refused:
        await calls.call(dep, "POST", path, {}, b"{}", who=BOB)
    assert refused.value.status == 404
    message = str(refused.value)
    assert "the endpoint URL serves Open Inference Protocol v2" in message
    assert 'through the gateway, <hub>/services/gpulab/v1, with model "alice/chat"' in message
    assert replica[1] == []  # never reached the replica


async def test_only_oip_v2_routes_reach_the_replica(calls, replica):
    dep = calls.callable_endpoint(ALICE, "alice", "chat")
    with pytest.raises(CallRefused) as refused:
        await calls.call(dep, "GET", "metrics", {}, None, who=ALICE)
    assert refused.value.status == 404
    assert "no route /metrics at an endpoint URL" in str(refused.value)
    assert "endpoints/alice/chat/v2/..." in str(refused.value)
    for path in ("v2", "v2/health/ready", "v2/models/chat", "v2/models/chat/infer?x=1"):
        status, _, _, _ = await calls.call(dep, "GET", path, {}, None, who=ALICE)
        assert status == 200, path
    # A version named in the path goes to that version, the path without it.
    await calls.call(dep, "POST", "v2/models/chat/versions/1/infer", {}, b"{}", who=ALICE)
    assert replica[1] == [
        "/v2",
        "/v2/health/ready",
        "/v2/models/chat",
        "/v2/models/chat/infer?x=1",
        "/v2/models/chat/infer",
    ]


class StandInHub:
    """The hub's answers for tokens: ``<name>-token`` is user ``name``."""

    access_scopes = {"access:services!service=gpulab"}

    async def user_for_token(self, token, use_cache=False, sync=False):
        name = token.removesuffix("-token")
        return {"name": name, "kind": "user", "scopes": sorted(self.access_scopes)}

    def check_scopes(self, required, model):
        return set(required) & set(model["scopes"])


@contextlib.asynccontextmanager
async def serving_router(calls):
    """The endpoint router over the table's calls (as the standby runs it), on a port:
    alice's endpoint's URL."""

    async def identify(model):
        return {"alice": ALICE, "bob": BOB, "root": ADMIN}[model["name"]]

    router = EndpointRouter(
        calls,
        prefix="/services/gpulab/",
        max_upload_mib=1,
        identify=identify,
        hub_auth=StandInHub(),
    )
    runner = web.ServerRunner(web.Server(router.handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/services/gpulab/endpoints/alice/chat"
    finally:
        await runner.cleanup()


@pytest.fixture
async def router(calls):
    async with serving_router(calls) as url:
        yield url


async def post(url: str, token: str) -> tuple[int, dict]:
    # encoded=True: the path goes as written ("..", "%76"), as any raw HTTP client sends it.
    headers = {"Authorization": f"token {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(URL(url, encoded=True), data=b"{}", headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_the_router_answers_a_v1_path_with_a_404_in_the_oip_shape(router, replica):
    for path in ("v1/chat/completions", "v2/../v1/chat/completions", "%761/completions"):
        status, doc = await post(f"{router}/{path}", "bob-token")
        assert status == 404, (path, doc)
        assert set(doc) == {"error"} and "<hub>/services/gpulab/v1" in doc["error"]
    status, doc = await post(f"{router}/v2/models/chat/infer", "bob-token")
    assert (status, doc) == (200, {"outputs": "ok"})
    assert replica[1] == ["/v2/models/chat/infer"]


async def test_only_the_owner_and_admins_read_a_versions_state_message(calls, router):
    """The replica went away (its socket is gone): the refusal says the version's state;
    its message (a log tail here) only to alice and admins."""
    calls.load([endpoint([[0, "unix:/nonexistent/replica.sock"]], message=FAILED)])
    seen = {}
    for token in ("alice-token", "root-token", "bob-token"):
        status, doc = await post(f"{router}/v2/models/chat/infer", token)
        assert status == 503
        seen[token] = doc["error"]
    assert LOG_TAIL in seen["alice-token"] and LOG_TAIL in seen["root-token"]
    assert LOG_TAIL not in seen["bob-token"] and "Last log" not in seen["bob-token"]
    assert seen["bob-token"] == (
        f"no replica of alice/chat version 1 is ready (running: {ASK_THE_OWNER}); try again shortly"
    )


async def test_a_failed_versions_log_is_the_owners_on_the_live_path_too(tmp_path):
    """The live call path: a failed version refuses the call with its message, which
    is where the backend put the replicas' last log lines."""
    (tmp_path / "model.json").write_text(json.dumps({"kind": "sentence-embedding"}))
    serving = SimpleNamespace(
        ready_replicas=lambda unit: [], forget=lambda vid: None, model_dir=lambda vid: tmp_path
    )
    live = LiveEndpoints(store=None, serving=serving)
    row = {k: v for k, v in endpoint([], message=FAILED, state="failed").items() if k != "versions"}
    row.update(replicas=1, max_replicas=1, target_inflight=None, scale_down_delay_s=300.0)
    vrow = {**endpoint([])["versions"][0], "state": "failed", "message": FAILED}
    live.record(row, [vrow])
    calls = LiveCalls(live, serving, SimpleNamespace(cold_start_seconds=1.0), EndpointProxy())
    try:
        dep = calls.callable_endpoint(BOB, "alice", "chat")
        for who, tells in ((BOB, False), (None, False), (ALICE, True), (ADMIN, True)):
            with pytest.raises(CallRefused) as refused:
                await calls.call(dep, "POST", "v2/models/chat/infer", {}, b"{}", who=who)
            assert refused.value.status == 503
            assert (LOG_TAIL in str(refused.value)) == tells, who
        assert str(refused.value) == f"version 1 failed: {FAILED}"
        with pytest.raises(CallRefused) as refused:
            await calls.embed(BOB, "alice", "chat", ["a text"])
        assert str(refused.value) == f"version 1 failed: {ASK_THE_OWNER}"
    finally:
        await calls.proxy.close()


def test_a_call_is_held_to_what_a_model_server_takes():
    """A replica refuses a body over 256 MiB (``--max-body-mib``): the service refuses
    it first, never holding up to ``max_upload_mib`` (GiBs, for model uploads) of it."""
    from gpulab.service.endpoints.calls import MAX_CALL_MIB
    from gpulab.service.endpoints.router import call_limit, call_too_large
    from gpulab.serving.server import DEFAULT_MAX_BODY_MIB

    assert MAX_CALL_MIB == DEFAULT_MAX_BODY_MIB
    assert call_limit(2048) == 256 << 20 and call_limit(16) == 16 << 20
    assert call_too_large(2048) == (
        "the request is larger than 256 MiB, the most a model server takes; send fewer rows"
    )
    assert "raise c.GpuLabService.max_upload_mib" in call_too_large(16)


async def test_the_router_refuses_a_call_over_its_limit_chunked_or_not(router, replica):
    headers = {"Authorization": "token bob-token"}

    async def chunks():
        for _ in range(3):
            yield b"x" * (1 << 20)  # 3 MiB in all, over the router's 1 MiB

    async with aiohttp.ClientSession() as session:
        for body in (b"x" * (2 << 20), chunks()):
            async with session.post(
                f"{router}/v2/models/chat/infer", data=body, headers=headers
            ) as r:
                assert r.status == 413, await r.text()
                assert "larger than 1 MiB" in (await r.json())["error"]
    assert replica[1] == []


@contextlib.asynccontextmanager
async def calls_to_a_page(tmp_path, text: str, kind: str):
    """The endpoint table's calls to alice's endpoint, whose replica (her code) answers
    every route with ``text`` as ``kind``."""

    async def page(request):
        return web.Response(text=text, content_type=kind)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    async with replica_on_socket(app, str(tmp_path / "alice.sock")) as address:
        calls = TableCalls()
        calls.load([endpoint([[0, address]])])
        try:
            yield calls
        finally:
            await calls.proxy.close()


async def test_a_page_a_replica_answers_is_not_run_on_the_hubs_origin(tmp_path):
    """alice's replica (her code) answers a GET with HTML and a script; she sends an
    admin (who may call every endpoint) the URL. What the browser gets is bytes to save,
    never a page of the hub's origin: the type is held to what an endpoint answers,
    never guessed, and nothing in it runs."""
    from gpulab.service.endpoints.router import answer_headers

    script = "<script>fetch('/hub/api/users')</script>"
    async with calls_to_a_page(tmp_path, script, "text/html") as calls:
        dep = calls.callable_endpoint(ADMIN, "alice", "chat")
        status, _, headers, body = await calls.call(dep, "GET", "v2", {}, None, who=ADMIN)
    assert status == 200 and b"<script>" in body
    out = answer_headers(headers)
    assert out["Content-Type"] == "application/octet-stream"
    assert out["X-Content-Type-Options"] == "nosniff"
    assert out["Content-Security-Policy"] == "default-src 'none'; sandbox"
    # What an endpoint does answer keeps its type.
    for kind in ("application/json", "application/octet-stream", "text/event-stream"):
        assert answer_headers({"Content-Type": kind})["Content-Type"] == kind
    assert answer_headers({})["Content-Type"] == "application/octet-stream"


async def test_the_router_sends_a_replicas_page_as_bytes(tmp_path):
    async with (
        calls_to_a_page(tmp_path, "<svg onload=alert(1)>", "image/svg+xml") as calls,
        serving_router(calls) as url,
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v2", headers={"Authorization": "token root-token"}) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in r.headers["Content-Security-Policy"]
