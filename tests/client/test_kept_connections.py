"""The sync client keeps its connections: searches in a loop (``Collection.search``)
go over one kept-alive connection, not a new one (through the hub's proxy) each; it
lets one go after idling less than the proxy's keep-alive, and calls made on a
caller's own event loop keep nothing past the call."""

import asyncio
import gc
import time

import pytest
from aiohttp import web

import gpulab.client as gl
from gpulab.client import base


@pytest.fixture(autouse=True)
def fresh_sessions(monkeypatch):
    """Each test starts with no kept session, and closes those it made."""
    kept = {}
    monkeypatch.setattr(base, "_KEPT", kept)
    yield
    for session in kept.values():
        gl.run_sync(session.close(), timeout=30)


@pytest.fixture
def counted(serve):
    """A service answering every POST, noting the client's address of each request."""
    peers = []

    async def search(request):
        peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({"hits": []})

    app = web.Application()
    app.router.add_post("/api/collections/alice/docs/search", search)
    with serve(app) as url:
        yield f"{url}/api", peers


def test_sync_calls_share_one_kept_connection(counted):
    api, peers = counted
    c = gl.Client(api, token="t")
    for _ in range(5):
        assert c.collection_call("alice", "docs", "search", {"vector": [0.0]}) == {"hits": []}
    assert len(peers) == 5 and len(set(peers)) == 1


def test_an_idle_kept_connection_is_let_go_before_a_proxy_would(counted, monkeypatch):
    monkeypatch.setattr(base, "KEEPALIVE_S", 0.2)
    api, peers = counted
    c = gl.Client(api, token="t")
    c.collection_call("alice", "docs", "search", {})
    time.sleep(1.0)  # past the client's keep-alive: it closed the connection itself
    c.collection_call("alice", "docs", "search", {})
    assert len(set(peers)) == 2


def test_calls_on_the_callers_own_loop_keep_no_connection(counted, recwarn):
    api, peers = counted
    c = gl.AsyncClient(api, token="t")
    for _ in range(2):  # each asyncio.run is a loop of its own, closed after it
        asyncio.run(c.collection_call("alice", "docs", "search", {}))
    assert len(set(peers)) == 2
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]


def test_clients_dropped_leave_no_session_behind(counted, recwarn):
    """Each Collection() makes a client: dropping them closes nothing that warns, and
    they share the one kept connection."""
    api, peers = counted
    for _ in range(3):
        gl.Client(api, token="t").collection_call("alice", "docs", "search", {})
        gc.collect()
    assert len(set(peers)) == 1
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]
