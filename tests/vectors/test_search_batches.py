"""Searches that arrive together are sent to the engine together (one FAISS call for
several requests): each request still gets the hits of its own vectors, a multi-vector
search its own rows in its own order, and a refused search fails alone. On the real
service (in-process, a stand-in hub API) and the real embedded engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hubproc import let_accounts_reach
from support.service import running_service

pytestmark = pytest.mark.slow

DIM = 16
ROWS = 200


async def test_concurrent_searches_each_get_their_own_hits(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        rng = np.random.default_rng(1)
        vectors = rng.normal(size=(ROWS, DIM))
        vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).tolist()
        for owner, token in (("alice", alice), ("bob", bob)):
            r = await svc.request(
                "POST", "/collections", token=token, json={"name": "d", "dim": DIM}
            )
            assert r.status_code == 201, r.text
            body = {"ids": [f"{owner}-{i}" for i in range(ROWS)], "vectors": vectors}
            r = await svc.request("POST", f"/collections/{owner}/d/insert", token=token, json=body)
            assert r.status_code == 200, r.text

        def search(owner, token, body):
            return svc.request("POST", f"/collections/{owner}/d/search", token=token, json=body)

        # 60 requests at once: single vectors of both owners, multi-vector searches, and
        # searches refused by a filter, interleaved.
        calls = []
        for i in range(60):
            owner, token = ("alice", alice) if i % 2 else ("bob", bob)
            if i % 10 == 3:
                calls.append(
                    (
                        "many",
                        owner,
                        [i, i + 1, i + 2],
                        search(
                            owner,
                            token,
                            {"vectors": [vectors[i], vectors[i + 1], vectors[i + 2]], "k": 2},
                        ),
                    )
                )
            elif i % 10 == 7:
                bad = {"vector": vectors[i][:3], "k": 2}
                calls.append(("refused", owner, [i], search(owner, token, bad)))
            else:
                calls.append(
                    ("one", owner, [i], search(owner, token, {"vector": vectors[i], "k": 3}))
                )
        answers = await asyncio.gather(*(call for *_, call in calls))

        for (kind, owner, rows, _), r in zip(calls, answers, strict=True):
            if kind == "refused":
                assert r.status_code == 400, r.text
                continue
            assert r.status_code == 200, r.text
            if kind == "one":
                hits = r.json()["hits"]
                assert len(hits) == 3 and hits[0]["id"] == f"{owner}-{rows[0]}"
            else:
                results = r.json()["results"]
                assert [hits[0]["id"] for hits in results] == [f"{owner}-{i}" for i in rows]
                assert all(len(hits) == 2 for hits in results)
