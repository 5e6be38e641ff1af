"""gpulab's own objects in a notebook survive a hibernation: the client, a vector
collection and its hits are saved as a kernel saves them (``save_namespace``) and
work after the wake, against the real service (in-process, a stand-in hub API) and
its real vector engine. A client made from the server's environment comes back with
the environment of the server it wakes in: the old server's token is gone by then.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hubproc import let_accounts_reach
from support.service import running_service

from gpulab.magics.namespace_state import load_namespace, save_namespace

pytestmark = pytest.mark.slow


async def test_client_and_collection_come_back_and_work(tmp_path, monkeypatch):
    from gpulab.client import AsyncClient, Client, Collection

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        first = svc.create_user("alice")
        monkeypatch.setenv("JUPYTERHUB_USER", "alice")
        monkeypatch.setenv("GPULAB_API_URL", svc.api)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", first)
        vectors = np.eye(8, dtype=np.float32)

        def before():
            docs = Collection("docs", dim=8)  # its client from the server's environment
            docs.insert(vectors=vectors, metadata=[{"i": i} for i in range(8)])
            given = Client(api_url=svc.api, token=first)
            hits = docs.search(vector=vectors[2], k=1)
            return {
                "docs": docs,
                "gl": Client(),
                "given": given,
                "aio": AsyncClient(),
                "hits": hits,
            }

        variables = await asyncio.to_thread(before)
        path = str(tmp_path / "0.state")
        report = save_namespace(variables, path)
        assert report.skipped == [] and report.saved == list(variables)

        # The server stops (its token dies) and starts again with a new one.
        del svc.fake_hub.tokens[first]
        second = svc.create_user("alice")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", second)
        back: dict = {}
        loaded = load_namespace(path, back)
        assert loaded.failed == [] and loaded.restored == list(variables)

        def after():
            docs = back["docs"]
            assert repr(docs) == "Collection(alice/docs, dim=8)"
            assert docs.count() == 8
            assert docs.search(vector=vectors[5], k=1)[0]["metadata"] == {"i": 5}
            assert [c["name"] for c in back["gl"].collections()] == ["docs"]
            assert back["hits"][0].metadata == {"i": 2}
            return back["given"].aio._token, back["aio"]._token

        given_token, aio_token = await asyncio.to_thread(after)
        # Made with a token: that one; made from the environment: the new server's.
        assert given_token == first and aio_token == second
