"""The endpoint router asks the hub once per token, however many calls arrive with it.

A client's connections all carry one token; when the router's answer for it expires
(TOKEN_TTL_S), every call in flight missed it together and each asked the hub, which
under internal TLS stalled calls for seconds (benchmarks/endpoint_overhead.py --tls).
The hub here is a stand-in object (its answers and a count); the router is the real one.
"""

from __future__ import annotations

import asyncio

import pytest

from gpulab.service.auth import Identity
from gpulab.service.endpoints.router import Denied, EndpointRouter


class CountingHubAuth:
    """Answers as JupyterHub's HubAuth does, a little later, and counts the calls."""

    access_scopes = {"access:services!service=gpulab"}

    def __init__(self, users: dict[str, dict]):
        self.users = users
        self.calls = 0

    async def user_for_token(self, token, use_cache=False, sync=False):
        self.calls += 1
        await asyncio.sleep(0.05)  # the hub's round trip: calls pile up meanwhile
        return self.users.get(token)

    def check_scopes(self, required, model):
        return set(required) & set(model.get("scopes", []))


async def identify(model: dict) -> Identity:
    return Identity(name=model["name"], kind="user")


def router(hub_auth) -> EndpointRouter:
    return EndpointRouter(
        None, prefix="/services/gpulab/", max_upload_mib=1, identify=identify, hub_auth=hub_auth
    )


async def test_calls_with_one_token_ask_the_hub_once():
    alice = {"name": "alice", "kind": "user", "scopes": ["access:services!service=gpulab"]}
    hub = CountingHubAuth({"alice-token": alice})
    r = router(hub)
    who = await asyncio.gather(*(r._identify("alice-token") for _ in range(32)))
    assert {w.name for w in who} == {"alice"}
    assert hub.calls == 1
    # Answered from the cache afterwards; a new token is its own lookup.
    await r._identify("alice-token")
    assert hub.calls == 1


async def test_a_refusal_reaches_every_waiting_call_and_is_asked_once():
    hub = CountingHubAuth({})
    r = router(hub)
    results = await asyncio.gather(
        *(r._identify("forged") for _ in range(8)), return_exceptions=True
    )
    assert all(isinstance(e, Denied) and e.status == 401 for e in results), results
    assert hub.calls == 1
    assert r._lookups == {}


async def test_a_cancelled_call_does_not_cancel_the_others_lookup():
    alice = {"name": "alice", "kind": "user", "scopes": ["access:services!service=gpulab"]}
    hub = CountingHubAuth({"t": alice})
    r = router(hub)
    first = asyncio.ensure_future(r._identify("t"))
    second = asyncio.ensure_future(r._identify("t"))
    await asyncio.sleep(0)
    first.cancel()
    assert (await second).name == "alice"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert hub.calls == 1


def test_hub_auth_builds_one_tls_context_for_the_same_files(tmp_path):
    from jupyterhub.services import auth
    from support.tls_certs import issue_cert, make_ca

    from gpulab.service import tls

    ca = make_ca(tmp_path)
    cert, key = issue_cert(tmp_path, ca)
    original = auth.make_ssl_context
    try:
        tls.reuse_hub_auth_contexts()
        tls.reuse_hub_auth_contexts()  # twice: still one cache
        one = auth.make_ssl_context(key, cert, cafile=ca[0])
        assert auth.make_ssl_context(key, cert, cafile=ca[0]) is one
        assert auth.make_ssl_context.cache_info().misses == 1
    finally:
        auth.make_ssl_context = original


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def warm_router(users: dict):
    from gpulab.service.endpoints.router import TokenCache

    hub = CountingHubAuth(users)
    r = router(hub)
    clock = Clock()
    r.tokens = TokenCache(clock=clock)
    return r, hub, clock


ALICE = {"name": "alice", "kind": "user", "scopes": ["access:services!service=gpulab"]}


async def test_a_token_in_use_is_asked_again_before_its_answer_expires():
    """A client that pauses between bursts finds its token's answer still fresh:
    the router asked the hub again in the background, not on the burst's path."""
    from gpulab.service.endpoints.router import REFRESH_AHEAD_S, TOKEN_TTL_S

    r, hub, clock = warm_router({"t": ALICE})
    await r._identify("t")
    assert hub.calls == 1
    clock.now += TOKEN_TTL_S - REFRESH_AHEAD_S - 0.5  # not due yet
    assert await r.refresh_tokens() == 0
    clock.now += 1.0  # within REFRESH_AHEAD_S of its expiry
    assert await r.refresh_tokens() == 1
    assert hub.calls == 2
    clock.now += TOKEN_TTL_S - 0.1  # past the first answer's expiry, not the second's
    assert (await r._identify("t")).name == "alice"
    assert hub.calls == 2  # the call did not wait for the hub


async def test_a_token_revoked_meanwhile_is_refused_after_the_refresh():
    from gpulab.service.endpoints.router import REFRESH_AHEAD_S, TOKEN_TTL_S

    users = {"t": ALICE}
    r, hub, clock = warm_router(users)
    await r._identify("t")
    users.clear()  # revoked at the hub
    clock.now += TOKEN_TTL_S - REFRESH_AHEAD_S + 0.5
    assert await r.refresh_tokens() == 1
    with pytest.raises(Denied) as refused:
        await r._identify("t")
    assert refused.value.status == 401
    assert await r.refresh_tokens() == 0  # a refusal is not kept warm


async def test_an_idle_token_is_not_kept_warm():
    from gpulab.service.endpoints.router import KEEP_WARM_S, TOKEN_TTL_S

    r, hub, clock = warm_router({"t": ALICE})
    await r._identify("t")
    # Kept warm while used recently; a minute after its last use, no more.
    while clock.now < 1000.0 + KEEP_WARM_S - TOKEN_TTL_S:
        clock.now += 1.0
        await r.refresh_tokens()
    asked = hub.calls
    assert asked > 1
    clock.now += KEEP_WARM_S
    assert await r.refresh_tokens() == 0
    assert hub.calls == asked
    # Used again: a miss asks the hub, then it is kept warm again.
    await r._identify("t")
    assert hub.calls == asked + 1
    clock.now += TOKEN_TTL_S - 1.0
    assert await r.refresh_tokens() == 1


async def test_a_call_that_changes_something_asks_the_hub_again():
    """A token revoked a moment ago still reads from the cache for up to its TTL, but an
    upload, a fine-tuning job or a delete through the gateway asks the hub afresh."""
    from gpulab.service.endpoints.router import changes_state

    alice = {"name": "alice", "kind": "user", "scopes": ["access:services!service=gpulab"]}
    hub = CountingHubAuth({"t": alice})
    r = router(hub)
    assert (await r._identify("t")).name == "alice"
    del hub.users["t"]  # revoked on the hub
    assert (await r._identify("t")).name == "alice"  # a read: the cached answer
    with pytest.raises(Denied) as e:
        await r._identify("t", fresh=True)
    assert e.value.status == 401
    for method, path in (
        ("POST", "files"),
        ("DELETE", "files/file-1"),
        ("POST", "/fine_tuning/jobs"),
    ):
        assert changes_state(method, path), (method, path)
    for method, path in (("POST", "chat/completions"), ("GET", "files"), ("POST", "embeddings")):
        assert not changes_state(method, path), (method, path)


async def test_an_encoded_path_is_judged_as_the_gateway_reads_it():
    """``v1/%66iles`` is ``v1/files``: an upload, whose token the hub is asked about
    afresh (judged on the raw path it was a read, answered from the cache)."""
    from aiohttp.test_utils import make_mocked_request

    alice = {"name": "alice", "kind": "user", "scopes": ["access:services!service=gpulab"]}
    hub = CountingHubAuth({"t": alice})
    r = router(hub)
    await r._identify("t")
    del hub.users["t"]  # revoked on the hub
    request = make_mocked_request("POST", "/services/gpulab/v1/%66iles")
    answer = await r._openai(request, "t", "%66iles")
    assert answer.status == 401
    nul = await r._openai(make_mocked_request("POST", "/x"), "t", "files%00")
    assert nul.status == 400
