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
