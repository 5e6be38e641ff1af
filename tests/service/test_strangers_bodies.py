"""A request the service may not serve (no token, a bad one, a token without the
service's scope) has its body read and dropped, never kept: the 401 or 403 comes once
it is in. Every route took up to its limit (64 MiB for collections, 2 GiB for the
gateway) into memory before the handler asked who sent it."""

from __future__ import annotations

import asyncio

import pytest
import requests
from support.service import running_service

from gpulab.service.api import request_body

#: 8 MiB of JSON: within every route's limit below.
BODY = b'{"ids": ["' + b"x" * (8 << 20) + b'"]}'


@pytest.fixture
def kept(monkeypatch):
    """The most bytes any handler held of a body while it came in."""
    most = {"bytes": 0}
    received = request_body.BoundedBody.data_received

    def spy(self, chunk):
        received(self, chunk)
        most["bytes"] = max(most["bytes"], sum(len(c) for c in self._chunks))

    monkeypatch.setattr(request_body.BoundedBody, "data_received", spy)
    return most


async def post(svc, path: str, token: str | None, body: bytes = BODY) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"token {token}"
    url = f"{svc.url}/services/gpulab/{path}"
    return await asyncio.to_thread(requests.post, url, data=body, headers=headers, timeout=120)


# Routes that take 8 MiB from a caller they serve (a collection's rows, a gateway call,
# a job's variables).
ROUTES = ["api/v1/collections/alice/docs/insert", "v1/embeddings", "api/v1/jobs"]


@pytest.mark.parametrize("path", ROUTES)
async def test_a_strangers_body_is_dropped_and_refused(tmp_path, kept, path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        for token in (None, "not-a-token"):
            r = await post(svc, path, token)
            assert r.status_code == 401, r.text
            assert kept["bytes"] == 0, f"{kept['bytes']} bytes kept of a stranger's body"
        # The same body from alice is read (and judged on what it says: no such
        # collection, no such model, not a job).
        r = await post(svc, path, alice)
        assert r.status_code in (400, 404), r.text
        assert kept["bytes"] == len(BODY)


async def test_a_users_sample_is_dropped_and_refused(tmp_path, kept):
    """The telemetry route takes 8 MiB from the node agents; a user, who may not push
    samples, has theirs dropped as it comes, not held until the 403."""
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        sample = b'{"node": "' + b"x" * (6 << 20) + b'"}'  # within the route's 8 MiB
        r = await post(svc, "api/v1/telemetry", alice, sample)
        assert r.status_code == 403, r.text
        assert "only the gpulab-agent service or an admin may push samples" in r.text
        assert kept["bytes"] == 0, f"{kept['bytes']} bytes kept of a user's sample"
