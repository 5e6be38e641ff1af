"""Vector collections on the real service (in-process, a stand-in hub API) and the real
embedded engine (FAISS behind its log, a process of its own): rows in and found again, every
bad input a 4xx with its reason and nothing half-written, the sharing rules of
endpoints, and no acknowledged row lost when the engine is killed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal

import numpy as np
import pytest
from hubproc import let_accounts_reach
from support.service import running_service
from support.wait import wait_until_async

pytestmark = pytest.mark.slow

DIM = 8


def unit_vectors(n: int, seed: int = 0) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()


def packed(vectors) -> str:
    """``vectors_base64``: base64 of little-endian float32 values, row after row."""
    return base64.b64encode(np.asarray(vectors, dtype="<f4").tobytes()).decode()


async def make(svc, token, name="docs", **body):
    r = await svc.request("POST", "/collections", token=token, json={"name": name, **body})
    assert r.status_code == 201, r.text
    return r.json()


async def test_rows_go_in_and_are_found_with_their_metadata(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        view = await make(svc, alice, dim=DIM)
        assert (view["owner"], view["name"], view["dim"], view["metric"]) == (
            "alice",
            "docs",
            DIM,
            "cosine",
        )
        vectors = unit_vectors(50)
        body = {
            "ids": [f"doc-{i}" for i in range(50)],
            "vectors": vectors,
            "metadata": [{"lang": "en" if i % 2 else "de", "n": i} for i in range(50)],
        }
        r = await svc.request("POST", "/collections/alice/docs/insert", token=alice, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["count"] == 50

        r = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vector": vectors[7], "k": 3},
        )
        hits = r.json()["hits"]
        assert hits[0]["id"] == "doc-7" and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert hits[0]["metadata"] == {"lang": "en", "n": 7}
        assert len(hits) == 3

        # A filter: as Milvus's expression or as {key: value}; every hit matches.
        for flt in ('metadata["lang"] == "de"', {"lang": "de"}):
            r = await svc.request(
                "POST",
                "/collections/alice/docs/search",
                token=alice,
                json={"vector": vectors[7], "k": 5, "filter": flt},
            )
            assert r.status_code == 200, r.text
            assert {h["metadata"]["lang"] for h in r.json()["hits"]} == {"de"}

        # Several queries at once: one list of hits each.
        r = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vectors": vectors[:3], "k": 1},
        )
        assert [hits[0]["id"] for hits in r.json()["results"]] == ["doc-0", "doc-1", "doc-2"]

        # Upsert replaces a row; delete removes rows; the count follows.
        r = await svc.request(
            "POST",
            "/collections/alice/docs/upsert",
            token=alice,
            json={"ids": ["doc-7"], "vectors": [vectors[8]], "metadata": [{"lang": "fr"}]},
        )
        assert r.status_code == 200, r.text
        r = await svc.request(
            "POST", "/collections/alice/docs/delete", token=alice, json={"ids": ["doc-1", "nope"]}
        )
        assert r.json() == {"deleted": 1}
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.json()["count"] == 49
        r = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vector": vectors[8], "k": 2},
        )
        assert {h["id"] for h in r.json()["hits"]} == {"doc-7", "doc-8"}

        # Dropped: gone from the list, the name free again.
        r = await svc.request("DELETE", "/collections/alice/docs", token=alice)
        assert r.status_code == 200, r.text
        r = await svc.request("GET", "/collections", token=alice)
        assert r.json() == []
        await make(svc, alice, dim=4)


async def test_bad_input_is_refused_with_the_reason_and_nothing_is_written(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        insert = "/collections/alice/docs/insert"
        good = unit_vectors(3)
        many = [f"u{i}" for i in range(1001)]
        cases = [
            (insert, {"vectors": [good[0], good[1][:5]]}, 400, "has 5 numbers"),
            (insert, {"vectors": [good[0], [1.0] * (DIM - 1) + ["x"]]}, 400, "not a number"),
            (insert, {"vectors": unit_vectors(1001)}, 413, "at most 1000"),
            (insert, {"vectors": good, "ids": ["a", "a", "b"]}, 400, "same id twice"),
            (insert, {"vectors": good, "metadata": [{}, {}]}, 400, "list of 3 objects"),
            (insert, {"vectors": good, "colour": 1}, 400, "unknown field"),
            (insert, {"texts": ["hello"]}, 400, "names no embedding endpoint"),
            # The packed form (base64 of float32): bad base64, a cut vector, inf, both forms.
            (insert, {"vectors_base64": "not base64!"}, 400, "is not base64"),
            (insert, {"vectors_base64": packed([[1.0] * 5])}, 400, "not a whole number"),
            (insert, {"vectors_base64": packed([[np.inf] * DIM])}, 400, "not finite"),
            (insert, {"vectors_base64": packed(good), "vectors": good}, 400, "not both"),
            (insert, {"vectors_base64": packed(unit_vectors(1001))}, 413, "at most 1000"),
            ("/collections/alice/docs/search", {"vector": good[0], "filter": "lang =="}, 400, ""),
            ("/collections/alice/docs/search", {"vector": good[0], "k": 0}, 400, "k must be"),
            ("/collections", {"name": "x", "dim": 4, "metric": "hamming"}, 400, "unknown metric"),
            ("/collections", {"name": "Bad Name", "dim": 4}, 400, "collection name"),
            ("/collections", {"name": "x"}, 400, "dim is missing"),
            ("/collections", {"name": "x", "dim": 100_000}, 400, "dim must be"),
            ("/collections", {"name": "docs", "dim": 4}, 409, "already has"),
            # Every listing reads every share list: a list is at most 1000 names.
            ("/collections", {"name": "y", "dim": 4, "share_users": many}, 400, "a group"),
            # Only rows and queries may be large; a collection's own fields are 1 MiB.
            ("/collections", {"name": "z", "dim": 4, "meta": "x" * (2 << 20)}, 413, "1 MiB"),
        ]
        for path, body, status, words in cases:
            r = await svc.request("POST", path, token=alice, json=body)
            assert r.status_code == status, (body, r.text)
            assert words in r.json()["error"], (body, r.text)
        # NaN, and bytes that are not UTF-8: the body parser's 400.
        for raw in (b'{"vectors": [[NaN, 0, 0, 0, 0, 0, 0, 0]]}', b'{"vectors": "\xff\xfe"}'):
            r = await svc.request(
                "POST",
                insert,
                token=alice,
                data=raw,
                headers_extra={"Content-Type": "application/json"},
            )
            assert r.status_code == 400, r.text
        # None of it was written, and the 409 of an id taken writes none of its batch.
        assert (await svc.request("GET", "/collections/alice/docs", token=alice)).json()[
            "count"
        ] == 0
        r = await svc.request(
            "POST", insert, token=alice, json={"ids": ["a"], "vectors": [good[0]]}
        )
        assert r.status_code == 200
        r = await svc.request(
            "POST", insert, token=alice, json={"ids": ["b", "a"], "vectors": good[1:]}
        )
        assert r.status_code == 409 and "use upsert" in r.json()["error"], r.text
        assert (await svc.request("GET", "/collections/alice/docs", token=alice)).json()[
            "count"
        ] == 1


async def test_others_see_nothing_until_it_is_shared_and_admins_see_all(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        carol = svc.create_user("carol", groups=["lab"])
        await make(svc, alice, dim=DIM)
        vec = unit_vectors(1)
        uses = [
            ("GET", "/collections/alice/docs", None),
            ("POST", "/collections/alice/docs/search", {"vector": vec[0]}),
            ("POST", "/collections/alice/docs/insert", {"vectors": vec}),
        ]
        assert (await svc.request("GET", "/collections", token=bob)).json() == []
        for method, path, body in uses:
            r = await svc.request(method, path, token=bob, json=body)
            assert r.status_code == 403, r.text
            assert "not shared with you" in r.json()["error"]
        # No token at all: refused before anything is looked up.
        r = await svc.request("GET", "/collections/alice/docs", anonymous=True)
        assert r.status_code in (401, 403)
        # The admin sees it, and alice's own rows, without sharing.
        r = await svc.request("GET", "/collections")
        assert [c["collection"] for c in r.json()] == ["alice/docs"]
        r = await svc.request("POST", "/collections/alice/docs/search", json={"vector": vec[0]})
        assert r.status_code == 200, r.text

        # Shared with bob by name and with the group "lab": both may use it.
        r = await svc.request(
            "PATCH",
            "/collections/alice/docs",
            token=alice,
            json={"share_users": ["bob"], "share_groups": ["lab"]},
        )
        assert r.status_code == 200, r.text
        for token in (bob, carol):
            listed = (await svc.request("GET", "/collections", token=token)).json()
            assert [c["collection"] for c in listed] == ["alice/docs"]
            for method, path, body in uses:
                r = await svc.request(method, path, token=token, json=body)
                assert r.status_code == 200, r.text
            # Whom else she shares it with is hers (and admins') to read.
            one = (await svc.request("GET", "/collections/alice/docs", token=token)).json()
            for view in (listed[0], one):
                assert (view["share_users"], view["share_groups"]) == ([], [])
        for token in (alice, None):  # None: the admin
            one = (await svc.request("GET", "/collections/alice/docs", token=token)).json()
            assert (one["share_users"], one["share_groups"]) == (["bob"], ["lab"])
        # ... but not change its sharing or drop it.
        r = await svc.request("DELETE", "/collections/alice/docs", token=bob)
        assert r.status_code == 403 and "only alice and admins" in r.json()["error"]
        r = await svc.request(
            "PATCH", "/collections/alice/docs", token=bob, json={"share_users": []}
        )
        assert r.status_code == 403
        # bob's own collection of the same name is his, apart from alice's.
        await make(svc, bob, dim=DIM)
        r = await svc.request("GET", "/collections/bob/docs", token=bob)
        assert r.json()["count"] == 0
        # The audit trail has the making, the sharing and bob's refused drop.
        r = await svc.request("GET", "/audit", params={"subject": "alice/docs"})
        actions = [(e["action"], e["result"]) for e in r.json()["entries"]]
        assert ("collection.create", "ok") in actions
        assert ("collection.share", "ok") in actions
        assert ("collection.drop", "denied") in actions


async def test_a_killed_engine_loses_no_acknowledged_row(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        acknowledged: list[str] = []
        refused = 0
        vectors = unit_vectors(20)
        process = svc.app.vectors.process
        killed = None

        async def writer():
            nonlocal refused
            batch = after = 0
            # Until the engine was killed, came back, and took 20 more batches.
            while killed is None or process.restarts == 0 or batch < after + 20:
                ids = [f"b{batch}-{i}" for i in range(20)]
                batch += 1
                r = await svc.request(
                    "POST",
                    "/collections/alice/docs/insert",
                    token=alice,
                    json={"ids": ids, "vectors": vectors},
                )
                if r.status_code == 200:
                    acknowledged.extend(ids)
                else:  # the engine down: refused, and said so
                    assert r.status_code == 503, r.text
                    assert "try again" in r.json()["error"]
                    refused += 1
                    await asyncio.sleep(0.2)
                if killed is None or process.restarts == 0:
                    after = batch

        task = asyncio.create_task(writer())
        while len(acknowledged) < 200:
            await asyncio.sleep(0.05)
        killed = process.proc.pid
        os.kill(killed, signal.SIGKILL)
        await asyncio.wait_for(task, 120)
        # The engine came back by itself (a new process) and holds every acknowledged row.
        assert process.proc.pid != killed and process.restarts >= 1
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.status_code == 200, r.text
        count = r.json()["count"]
        assert count >= len(acknowledged) > 200
        found = set()
        engine = svc.app.vectors.engine
        for start in range(0, len(acknowledged), 500):
            found |= await engine.existing(
                "alice",
                svc.app.vectors.store.find("alice", "docs")["id"],
                acknowledged[start : start + 500],
            )
        assert found == set(acknowledged)


async def test_the_notebook_client_makes_fills_searches_and_shares(tmp_path, monkeypatch):
    from gpulab.client import Client, Collection
    from gpulab.client.errors import BadRequest, PermissionDenied

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = Client(api_url=svc.api, token=svc.create_user("alice"))
        bob = Client(api_url=svc.api, token=svc.create_user("bob"))
        monkeypatch.setenv("JUPYTERHUB_USER", "alice")
        vectors = np.asarray(unit_vectors(25), dtype=np.float32)

        def alices_work():
            with pytest.raises(BadRequest, match="give dim="):
                Collection("docs", client=alice)
            docs = Collection("docs", dim=DIM, client=alice)
            ids = docs.insert(vectors=vectors, metadata=[{"i": i} for i in range(25)], batch=10)
            assert len(ids) == 25 and docs.count() == 25
            hits = docs.search(vector=vectors[3], k=2)
            assert hits[0].id == ids[3] and hits[0]["metadata"] == {"i": 3}
            with pytest.raises(BadRequest, match="exists with 8-d vectors"):
                Collection("docs", dim=16, client=alice)
            return docs

        docs = await asyncio.to_thread(alices_work)

        def bobs_look():
            with pytest.raises(PermissionDenied, match="not shared with you"):
                Collection("alice/docs", client=bob)

        await asyncio.to_thread(bobs_look)
        await asyncio.to_thread(docs.share, users=["bob"])
        shared = await asyncio.to_thread(Collection, "alice/docs", client=bob)
        hits = await asyncio.to_thread(shared.search, vector=vectors[5], k=1)
        assert hits[0].metadata == {"i": 5}
        await asyncio.to_thread(docs.drop)
        assert await asyncio.to_thread(alice.collections) == []


async def test_no_other_account_reaches_the_engine(tmp_path):
    """The engine listens on a Unix socket only, in a directory of its own account: a
    user's process (here the account ``nobody``) can neither connect nor read its data."""
    import pwd
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("accounts need root: without it the engine runs as the service")
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        process = svc.app.vectors.process
        engine = pwd.getpwuid(os.stat(process.socket_dir).st_uid).pw_name
        assert engine == "gpulab_vectors"
        # The engine runs as that account, not as the service's.
        assert os.stat(f"/proc/{process.proc.pid}").st_uid == os.stat(process.socket_dir).st_uid
        for path in (process.socket_dir, process.root):
            assert os.stat(path).st_mode & 0o777 == 0o700, path
        # No TCP port: the engine's process listens on nothing but its socket.
        listening = subprocess.run(
            ["ss", "-H", "-ltnp"], capture_output=True, text=True, check=True
        ).stdout
        assert f"pid={process.proc.pid}," not in listening
        probe = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({process.socket!r})\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print(type(e).__name__)\n"
        )
        nobody = pwd.getpwnam("nobody")
        out = subprocess.run(
            [sys.executable, "-c", probe],
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            cwd="/",
        )
        assert out.stdout.strip() == "PermissionError", out


async def test_the_catalog_lists_collections_beside_endpoints(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        await make(svc, alice, dim=DIM)
        mine = (await svc.request("GET", "/models", token=alice)).json()
        assert [(m["kind"], m["collection"], m["shared"]) for m in mine] == [
            ("collection", "alice/docs", False)
        ]
        assert (await svc.request("GET", "/models", token=bob)).json() == []
        await svc.request(
            "PATCH", "/collections/alice/docs", token=alice, json={"share_users": ["bob"]}
        )
        theirs = (await svc.request("GET", "/models", token=bob)).json()
        assert [(m["collection"], m["shared"], m["dim"]) for m in theirs] == [
            ("alice/docs", True, DIM)
        ]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def mixed_rows(n: int) -> list[dict]:
    """Metadata of every kind a filter reads; ``s`` holds strings and numbers, the
    mixed types the engine evaluates row by row in Python (its slow path)."""
    return [
        {
            "lang": ("en", "de", "fr")[i % 3],
            "n": i,
            "tags": ["even" if i % 2 == 0 else "odd", f"t{i % 5}"],
            "title": f"intro to {i}" if i % 4 == 0 else f"chapter {i} end",
            "deep": {"x": i % 3},
            "s": "a" * 30 if i % 2 else i,
        }
        for i in range(n)
    ]


async def filled(svc, n: int = 40):
    alice = svc.create_user("alice")
    await make(svc, alice, dim=DIM)
    rows, vectors, ids = mixed_rows(n), unit_vectors(n), [f"doc-{i}" for i in range(n)]
    r = await svc.request(
        "POST",
        "/collections/alice/docs/insert",
        token=alice,
        json={"ids": ids, "vectors": vectors, "metadata": rows},
    )
    assert r.status_code == 200, r.text
    return alice, rows, vectors, ids


async def test_the_filters_people_write_find_their_rows(tmp_path):
    """Each filter of the grammar, written out by the service for the engine, finds
    exactly the rows it names (in on a JSON path included)."""
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice, rows, vectors, ids = await filled(svc)

        def where(pred):
            return {ids[i] for i, m in enumerate(rows) if pred(i, m)}

        expected = {
            'metadata["lang"] == "de"': where(lambda i, m: m["lang"] == "de"),
            'metadata["n"] >= 30': where(lambda i, m: i >= 30),
            '10 > metadata["n"]': where(lambda i, m: i < 10),
            'metadata["lang"] in ["de", "fr"]': where(lambda i, m: m["lang"] != "en"),
            'metadata["lang"] not in ["de", "fr"]': where(lambda i, m: m["lang"] == "en"),
            'metadata["title"] like "intro%"': where(lambda i, m: i % 4 == 0),
            'metadata["title"] like "%3%"': where(lambda i, m: "3" in m["title"]),
            'metadata["title"] like "chapter%end"': where(lambda i, m: i % 4 != 0),
            'metadata["s"] like "%a"': where(lambda i, m: i % 2 == 1),
            'json_contains(metadata["tags"], "t1")': where(lambda i, m: i % 5 == 1),
            'metadata["deep"]["x"] == 2 && !(metadata["n"] < 20)': where(
                lambda i, m: i % 3 == 2 and i >= 20
            ),
            'id in ["doc-3", "doc-4"] or (metadata["lang"] == "en" and metadata["n"] > 35)': (
                where(lambda i, m: i in (3, 4) or (m["lang"] == "en" and i > 35))
            ),
        }
        for flt, want in expected.items():
            r = await svc.request(
                "POST",
                "/collections/alice/docs/search",
                token=alice,
                json={"vector": vectors[0], "k": len(ids), "filter": flt},
            )
            assert r.status_code == 200, (flt, r.text)
            assert {h["id"] for h in r.json()["hits"]} == want, flt


async def test_what_could_hang_or_crash_the_engine_is_a_400_before_it(tmp_path, caplog):
    """A backtracking like on a key of mixed types (39.9 s a search), 1,500 nested '(' or
    1,000 'not' (the engine parser's stack: a 500), a lone surrogate (a 500), 1,000
    queries of k=1,000 (21 s of the engine for everyone): each a 400 that says why, and
    the log gets one line each, no pymilvus traceback."""
    let_accounts_reach(tmp_path)
    pymilvus_log = _Records()
    logging.getLogger("pymilvus").addHandler(pymilvus_log)
    try:
        async with running_service(tmp_path / "svc") as svc:
            alice, rows, vectors, ids = await filled(svc)
            search = "/collections/alice/docs/search"
            caplog.clear()
            refused = [
                ('metadata["s"] like "%a%a%a%a%a%a%a%a%b"', "like pattern"),
                ("(" * 1500 + 'metadata["n"] == 1' + ")" * 1500, "nested more than 32"),
                ("not " * 1000 + 'metadata["n"] == 1', "nested more than 32"),
                ('metadata["s"] == "\ud800"', "lone UTF-16 surrogate"),
                ({"lang": "\udfff"}, "lone UTF-16 surrogate"),
                ('lang == "en"', 'write metadata["lang"]'),
            ]
            for flt, words in refused:
                r = await svc.request(
                    "POST", search, token=alice, json={"vector": vectors[0], "filter": flt}
                )
                assert r.status_code == 400, (str(flt)[:60], r.text)
                assert words in r.json()["error"], r.text
            # A lone surrogate anywhere in a collection's body: a 400, not the engine's 500.
            r = await svc.request(
                "POST",
                "/collections/alice/docs/insert",
                token=alice,
                json={"vectors": vectors[:1], "metadata": [{"title": "x\ud83d"}]},
            )
            assert r.status_code == 400, r.text
            assert "metadata[0]['title'] holds a lone UTF-16 surrogate" in r.json()["error"]
            # A search's size: query vectors, and query vectors times k, each capped.
            for body, words in (
                ({"vectors": unit_vectors(101), "k": 1}, "101 query vectors in one search"),
                ({"vectors": unit_vectors(11), "k": 1000}, "11000 hits; at most 10000"),
            ):
                r = await svc.request("POST", search, token=alice, json=body)
                assert r.status_code == 400, r.text
                assert words in r.json()["error"], r.text
            r = await svc.request(
                "POST", search, token=alice, json={"vectors": unit_vectors(10), "k": 1000}
            )
            assert r.status_code == 200 and len(r.json()["results"]) == 10
            # One line each in the service's log, and no traceback.
            logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert not [r for r in logged if r.exc_info or "Traceback" in r.getMessage()]
            assert all("\n" not in r.getMessage() for r in logged)
    finally:
        logging.getLogger("pymilvus").removeHandler(pymilvus_log)
    assert [r.getMessage()[:200] for r in pymilvus_log.records] == []


async def test_a_call_past_its_limit_is_abandoned_and_a_stuck_engine_restarted(tmp_path, caplog):
    """Past c.VectorSettings.vector_call_timeout a call is answered 504 with one line;
    an engine that answers nothing then (here stopped with SIGSTOP, as a call that held
    it would) is killed and started again, and bob's search and alice's rows are there
    after."""
    let_accounts_reach(tmp_path)
    caplog.set_level(logging.INFO, "gpulab.service.vectors")
    config = "c.VectorSettings.vector_call_timeout = 2\n"
    async with running_service(tmp_path / "svc", config=config) as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        await make(svc, alice, dim=DIM)
        await make(svc, bob, name="notes", dim=DIM)
        vectors = unit_vectors(4)
        for who, path in ((alice, "alice/docs"), (bob, "bob/notes")):
            r = await svc.request(
                "POST",
                f"/collections/{path}/insert",
                token=who,
                json={"ids": ["r0", "r1", "r2", "r3"], "vectors": vectors},
            )
            assert r.status_code == 200, r.text
        process = svc.app.vectors.process
        stuck = process.proc.pid
        os.kill(stuck, signal.SIGSTOP)
        await wait_until_async(lambda: _state(stuck) == "T", "the engine stopped")
        r = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vector": vectors[0]},
            timeout=120,
        )
        if r.status_code != 504:  # say what held the answer, for whoever reads CI
            print(_engines_seen(process, stuck, caplog))
        assert r.status_code == 504, r.text
        error = r.json()["error"]
        assert "within 2 s" in error and "abandoned" in error and "\n" not in error
        # The engine answered nothing while held: killed and started again.
        await wait_until_async(
            lambda: process.restarts >= 1 and process.running and process.proc.pid != stuck,
            "the stuck vector engine restarted",
        )
        await wait_until_async(
            lambda: _searched(svc, bob, "bob/notes", vectors[3]), "bob's search answered"
        )
        r = await svc.request(
            "POST", "/collections/bob/notes/search", token=bob, json={"vector": vectors[3], "k": 1}
        )
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "r3"
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.json()["count"] == 4


def _state(pid: int) -> str:
    """The process's state letter (T: stopped), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _engines_seen(process, stuck: int, caplog) -> str:
    """The engine processes of this test's service and what the log said: in two CI
    runs a search was answered while the engine stopped with SIGSTOP was held."""
    import psutil

    lines = [f"stopped pid {stuck}, now pid {process.proc.pid}, restarts {process.restarts}"]
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "engine_server" in " ".join(child.cmdline()):
                lines.append(f"engine {child.pid}: {child.status()} {child.cmdline()[-3:]}")
    lines += [f"log: {r.levelname} {r.getMessage()[:200]}" for r in caplog.records]
    return "\n".join(lines)


async def _searched(svc, token, path, vector) -> bool:
    r = await svc.request(
        "POST", f"/collections/{path}/search", token=token, json={"vector": vector, "k": 1}
    )
    return r.status_code == 200


def test_the_endpoint_warning_shows_only_the_callers_own_share_lists():
    """A collection that embeds through bob's endpoint (shared with alice): sharing it
    said bob's whole share lists to alice, in the fix it suggested."""
    from types import SimpleNamespace

    from gpulab.service.vectors.manager import CollectionManager

    endpoints = {
        ("bob", "ep"): {"share_users": ["alice", "secret-friend"], "share_groups": ["hidden"]},
        ("alice", "mine"): {"share_users": ["dan"], "share_groups": []},
    }
    manager = SimpleNamespace(endpoint_row=lambda owner, name: endpoints[(owner, name)])
    row = {"user": "alice", "name": "docs", "share_users": ["carol"], "share_groups": []}
    said = CollectionManager._endpoint_not_shared(manager, {**row, "embed": "bob/ep"})
    assert "which carol may not call" in said and "ask bob to share endpoint ep" in said
    assert "secret-friend" not in said and "hidden" not in said
    own = CollectionManager._endpoint_not_shared(manager, {**row, "embed": "alice/mine"})
    assert "share_users=['dan', 'carol']" in own


async def test_one_users_collections_hold_at_most_their_rows(tmp_path):
    """The embedded engine keeps every row in memory: inserts in a loop by one user
    filled it for everyone. A collection's rows count as its owner's, whoever writes."""
    let_accounts_reach(tmp_path)
    config = "c.VectorSettings.max_rows_per_user = 5\n"
    async with running_service(tmp_path / "svc", config) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        await make(svc, alice, dim=DIM, share_users=["bob"])
        await make(svc, alice, name="more", dim=DIM)

        async def insert(token, name, n, seed=0):
            body = {"vectors": unit_vectors(n, seed)}
            return await svc.request(
                "POST", f"/collections/alice/{name}/insert", token=token, json=body
            )

        assert (await insert(alice, "docs", 3)).status_code == 200
        r = await insert(bob, "docs", 3, seed=1)  # bob writes into alice's: hers
        assert r.status_code == 403, r.text
        assert "alice's collections hold 3 rows; 3 more would pass the 5" in r.json()["error"]
        assert "max_rows_per_user" in r.json()["error"]
        assert (await insert(alice, "more", 2, seed=2)).status_code == 200
        assert (await insert(alice, "more", 1, seed=3)).status_code == 403
        # Deleting gives room back.
        hits = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vector": unit_vectors(1)[0], "k": 3},
        )
        gone = [h["id"] for h in hits.json()["hits"]][:2]
        r = await svc.request(
            "POST", "/collections/alice/docs/delete", token=alice, json={"ids": gone}
        )
        assert r.json() == {"deleted": 2}
        assert (await insert(alice, "more", 2, seed=4)).status_code == 200
        # Bob's own collections are his to fill.
        await make(svc, bob, name="his", dim=DIM)
        r = await svc.request(
            "POST",
            "/collections/bob/his/insert",
            token=bob,
            json={"vectors": unit_vectors(5, seed=5)},
        )
        assert r.status_code == 200, r.text


async def test_one_users_collections_take_at_most_their_memory(tmp_path):
    """Rows of many small metadata keys took 15 times their JSON in the engine's memory,
    and the row limit alone let one user fill the host: what the rows cost (vector,
    metadata JSON, each key) is budgeted per owner, and a row's keys are capped."""
    let_accounts_reach(tmp_path)
    config = "c.VectorSettings.max_mib_per_user = 1\n"
    async with running_service(tmp_path / "svc", config) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        await make(svc, alice, dim=DIM, share_users=["bob"])

        async def insert(token, n, seed=0, text="x" * 1500):
            body = {"vectors": unit_vectors(n, seed), "metadata": [{"t": text}] * n}
            return await svc.request(
                "POST", "/collections/alice/docs/insert", token=token, json=body
            )

        assert (await insert(alice, 500)).status_code == 200  # about 0.8 MiB
        r = await insert(bob, 200, seed=1)  # bob's rows in alice's collection: hers
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error.startswith("alice's collections take 0.8 MiB of the vector engine's memory")
        assert "would pass the 1.0 MiB" in error and "max_mib_per_user" in error
        assert (await insert(alice, 100, seed=2, text="short")).status_code == 200
        r = await svc.request(
            "POST",
            "/collections/alice/docs/insert",
            token=alice,
            json={"vectors": unit_vectors(1), "metadata": [{f"k{i}": i for i in range(300)}]},
        )
        assert r.status_code == 413 and "more than 256 keys" in r.json()["error"], r.text
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.json()["count"] == 600


async def test_a_lookup_that_straddles_a_drop_does_not_bring_the_collection_back(tmp_path):
    """A lookup reads the row in a thread; a drop meanwhile must not leave the dropped
    row cached (its calls would go to a collection that is gone, and a new one of the
    name would stay hidden behind it)."""
    from gpulab.service.auth import Identity

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        manager = svc.app.vectors
        row = await manager.find(Identity("alice", "user"), "alice", "docs")
        manager._rows.clear()  # noqa: SLF001 - the next lookup reads the store
        reading, dropped = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        find = manager.store.find

        def slow_find(owner, name):
            found = find(owner, name)  # read before the drop
            loop.call_soon_threadsafe(reading.set)
            asyncio.run_coroutine_threadsafe(dropped.wait(), loop).result(30)
            return found

        manager.store.find = slow_find
        lookup = asyncio.create_task(manager.find(Identity("alice", "user"), "alice", "docs"))
        await reading.wait()
        manager.store.find = find
        await manager.drop(row)
        dropped.set()
        assert (await lookup)["id"] == row["id"]  # what it read, once
        await make(svc, alice, dim=DIM)
        assert (await manager.find(Identity("alice", "user"), "alice", "docs"))["id"] != row["id"]
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.status_code == 200 and r.json()["count"] == 0, r.text


@pytest.mark.parametrize("reader", ["find", "share"])
async def test_a_lookup_during_a_drops_removal_does_not_outlive_the_drop(tmp_path, reader):
    """A lookup (or a share) that read the row after the drop began and before its row
    was removed cached it then: a new collection of the same name went to the old one's
    id, which the engine no longer held."""
    from gpulab.service.auth import Identity

    let_accounts_reach(tmp_path)
    alice_id = Identity("alice", "user")
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        manager = svc.app.vectors
        row = await manager.find(alice_id, "alice", "docs")
        removing, go = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        remove = manager.store.remove

        def held_remove(cid):  # the drop waits here, its row not removed yet
            loop.call_soon_threadsafe(removing.set)
            asyncio.run_coroutine_threadsafe(go.wait(), loop).result(30)
            remove(cid)

        manager.store.remove = held_remove
        drop = asyncio.create_task(manager.drop(row))
        await removing.wait()
        manager.store.remove = remove
        if reader == "find":
            assert (await manager.find(alice_id, "alice", "docs"))["id"] == row["id"]
        else:
            await manager.share(alice_id, row, {"share_users": ["bob"]})
        go.set()
        await drop
        await make(svc, alice, dim=DIM)
        assert (await manager.find(alice_id, "alice", "docs"))["id"] != row["id"]
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.status_code == 200 and r.json()["count"] == 0, r.text


async def test_a_filter_of_many_in_values_is_searched_and_deleted_by(tmp_path, monkeypatch):
    """in with 100 values on a metadata path (LlamaIndex's doc_ids, a delete by filter)
    was written for the engine as 100 ==s or'd, which its parser refused: "more than 64
    conditions at character 1463", a place in a text the user never sent."""
    from gpulab.client import Client, Collection

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        await make(svc, alice, dim=DIM)
        ids, vectors = [f"doc-{i}" for i in range(120)], unit_vectors(120)
        r = await svc.request(
            "POST",
            "/collections/alice/docs/insert",
            token=alice,
            json={"ids": ids, "vectors": vectors, "metadata": [{"doc": i} for i in ids]},
        )
        assert r.status_code == 200, r.text
        flt = 'metadata["doc"] in [' + ", ".join(f'"doc-{i}"' for i in range(100)) + "]"
        r = await svc.request(
            "POST",
            "/collections/alice/docs/search",
            token=alice,
            json={"vector": vectors[0], "k": 1000, "filter": flt},
        )
        assert r.status_code == 200, r.text
        assert {h["id"] for h in r.json()["hits"]} == set(ids[:100])
        monkeypatch.setenv("JUPYTERHUB_USER", "alice")
        client = Client(api_url=svc.api, token=alice)
        docs = await asyncio.to_thread(Collection, "docs", client=client)
        assert await asyncio.to_thread(docs.delete, filter=flt) == 100
        assert await asyncio.to_thread(docs.count) == 20


async def test_deleting_a_hub_user_drops_their_collections_and_their_shares(tmp_path):
    """What the hub's delete_user asks of the service (hub_ext.user_removal): sharing is
    by name, so a later user given it must not own bob's collections nor search alice's."""
    from gpulab.hub_ext.user_removal import stop_work
    from gpulab.spawner.service_client import ServiceClient

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        await make(svc, alice, dim=DIM, share_users=["bob", "carol"])
        await make(svc, bob, name="mine", dim=DIM)
        hub = ServiceClient(svc.api, svc.fake_hub.service_token, retry_seconds=0)
        assert await stop_work(hub, "bob") == (0, 0)
        (left,) = (await svc.request("GET", "/collections")).json()
        assert left["collection"] == "alice/docs" and left["share_users"] == ["carol"], left
        bob_again = svc.create_user("bob")
        r = await svc.request("GET", "/collections/alice/docs", token=bob_again)
        assert r.status_code == 403, r.text
        assert (await svc.request("GET", "/collections", token=bob_again)).json() == []
