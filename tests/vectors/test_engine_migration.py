"""An upgrade from the Milvus Lite engine: the first start of the FAISS engine copies
every row of every collection the old one held (ids, vectors, metadata, the metric
and index) and the service finds them all, as before."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent import futures
from types import SimpleNamespace

import numpy as np
import pytest
from hubproc import let_accounts_reach
from support.service import running_service

DIM = 8


def unit_vectors(n: int, seed: int) -> list[list[float]]:
    v = np.random.default_rng(seed).normal(size=(n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()


class OldEngine:
    """Milvus Lite over a data dir, served on a socket as the old service ran it."""

    def __init__(self, data_dir: str):
        import grpc
        from milvus_lite.adapter.grpc.servicer import MilvusServicer
        from milvus_lite.db import MilvusLite
        from pymilvus.grpc_gen import milvus_pb2_grpc

        self.db = MilvusLite(data_dir)
        self.folder = tempfile.mkdtemp(prefix="gw-lite-")
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        milvus_pb2_grpc.add_MilvusServiceServicer_to_server(MilvusServicer(self.db), self.server)
        self.uri = "unix:" + os.path.join(self.folder, "s.sock")
        self.server.add_insecure_port(self.uri)
        self.server.start()

    def close(self):
        self.server.stop(grace=1).wait()
        self.db.close()
        shutil.rmtree(self.folder, ignore_errors=True)


async def test_collections_of_the_milvus_lite_engine_are_all_there_after_the_upgrade(tmp_path):
    from gpulab.service.vectors.engine import VectorEngine

    let_accounts_reach(tmp_path)
    # The service's own rows of two collections, as an older gpulab made them.
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        for who, name, body in (
            (alice, "docs", {"dim": DIM}),
            (bob, "notes", {"dim": DIM, "metric": "l2", "index": "flat"}),
        ):
            r = await svc.request("POST", "/collections", token=who, json={"name": name, **body})
            assert r.status_code == 201, r.text
        rows = {(c["user"], c["name"]): c["id"] for c in svc.app.vectors.store.list()}
    # Their vectors in the old engine's data, as it kept them; nothing in the new one.
    root = tmp_path / "svc" / "vectors"
    shutil.rmtree(root / "faiss")
    old = OldEngine(str(root))
    engine = VectorEngine(old.uri)
    vectors = {"alice": unit_vectors(1500, 1), "bob": unit_vectors(30, 2)}
    try:
        for (owner, _), cid in rows.items():
            metric, index = ("l2", "flat") if owner == "bob" else ("cosine", "hnsw")
            await engine.create(owner, cid, DIM, metric, index)
            for start in range(0, len(vectors[owner]), 500):
                batch = vectors[owner][start : start + 500]
                await engine.write(
                    owner,
                    cid,
                    [
                        {"id": f"{owner}-{start + i}", "vector": v, "metadata": {"n": start + i}}
                        for i, v in enumerate(batch)
                    ],
                    upsert=False,
                )
    finally:
        engine.close()
        old.close()
    owner_uid = os.stat(root).st_uid  # the engine's account reads what was written here
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), owner_uid, os.stat(root).st_gid)

    async with running_service(tmp_path / "svc") as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.status_code == 200, r.text
        assert r.json()["count"] == 1500
        r = await svc.request("GET", "/collections/bob/notes", token=bob)
        assert (r.json()["count"], r.json()["metric"]) == (30, "l2")
        ids = [f"alice-{i}" for i in range(1500)]
        found = set()
        for start in range(0, 1500, 500):
            found |= await svc.app.vectors.engine.existing(
                "alice", rows[("alice", "docs")], ids[start : start + 500]
            )
        assert found == set(ids)
        for who, path, vector, want in (
            (alice, "alice/docs", vectors["alice"][777], {"id": "alice-777", "n": 777}),
            (bob, "bob/notes", vectors["bob"][12], {"id": "bob-12", "n": 12}),
        ):
            r = await svc.request(
                "POST", f"/collections/{path}/search", token=who, json={"vector": vector, "k": 1}
            )
            assert r.status_code == 200, r.text
            hit = r.json()["hits"][0]
            assert {"id": hit["id"], "n": hit["metadata"]["n"]} == want
        # New rows go to the new engine beside the copied ones.
        r = await svc.request(
            "POST",
            "/collections/alice/docs/insert",
            token=alice,
            json={"ids": ["new"], "vectors": unit_vectors(1, 3)},
        )
        assert r.status_code == 200, r.text
        r = await svc.request("GET", "/collections/alice/docs", token=alice)
        assert r.json()["count"] == 1501


class FakeOldCollection:
    """A Milvus Lite collection as the copy reads it; says what each query asked for.
    Each query costs Milvus Lite a pass over every row; an offset also made it build
    every row before the page."""

    schema = SimpleNamespace(fields=[SimpleNamespace(name="vector", dim=DIM)])

    def __init__(self, n: int, fail_at: int | None = None):
        self.rows = sorted(
            (
                {"id": f"r{i:05d}", "vector": [1.0] + [0.0] * (DIM - 1), "metadata": {"n": i}}
                for i in range(n)
            ),
            key=lambda r: r["id"],
        )
        self.queries: list[tuple] = []
        self.fail_at = fail_at  # the query (counted from 1) at which the engine is killed

    def get_index_info(self, field):
        return {"metric_type": "COSINE", "index_type": "FLAT"}

    def load(self):
        pass

    def query(self, expr, output_fields, limit=None, offset=0, order_by_pk=False):
        self.queries.append((expr, limit, offset))
        if self.fail_at is not None and len(self.queries) == self.fail_at:
            raise KeyboardInterrupt("the start was cut short")
        rows = self.rows
        if expr:
            prefix = 'id > "'
            assert expr.startswith(prefix) and expr.endswith('"') and order_by_pk, expr
            last = expr[len(prefix) : -1].replace('\\"', '"').replace("\\\\", "\\")
            rows = [r for r in rows if r["id"] > last]
        end = None if limit is None else offset + limit
        return [{k: r[k] for k in output_fields} for r in rows[offset:end]]


class FakeMilvusLite:
    collection: FakeOldCollection

    def __init__(self, data_dir):
        pass

    def list_databases(self):
        return ["default", "u_alice"]

    def list_collections(self, database):
        return ["c1"]

    def get_collection(self, cid, database):
        return self.collection

    def close(self):
        pass


def test_the_copy_pages_by_id_and_goes_on_where_a_start_cut_short_left_it(tmp_path, monkeypatch):
    """Pages by offset made Milvus Lite build every row before each page: 80,000 rows
    took 29 s, 300,000 passed the engine's start limit, and each start began again
    from nothing. Now each page is the rows after the last id copied, the progress is
    kept, and a collection copied whole is not copied again."""
    import milvus_lite.db

    from gpulab.service.vectors import lite_migration
    from gpulab.service.vectors.embedded_store import Store

    for name in ("PAGE_MIN", "PAGE_MAX", "PAGE"):  # PAGE: before, one size for all
        monkeypatch.setattr(lite_migration, name, 100, raising=False)
    monkeypatch.setattr(milvus_lite.db, "MilvusLite", FakeMilvusLite)
    (tmp_path / "databases").mkdir()
    store = Store(str(tmp_path / "faiss"))
    FakeMilvusLite.collection = old = FakeOldCollection(1050, fail_at=5)
    with pytest.raises(KeyboardInterrupt):  # killed in its 4th page
        lite_migration.migrate(str(tmp_path), store)
    assert store.get("u_alice", "c1").count() == 300
    progress = tmp_path / "faiss" / "lite-migration.json"
    assert '"last": "r00299"' in progress.read_text()

    FakeMilvusLite.collection = old = FakeOldCollection(1050)
    assert lite_migration.migrate(str(tmp_path), store) == 1050
    assert store.get("u_alice", "c1").count() == 1050
    assert not progress.exists() and (tmp_path / "faiss" / lite_migration.MARKER).exists()
    want, *pages = old.queries
    assert want == (None, None, 0)  # the ids, counted
    assert pages[0] == ('id > "r00299"', 100, 0)  # where the last start stopped
    assert all(offset == 0 and limit == 100 for _, limit, offset in pages)
    assert len(pages) == 9  # 750 rows in pages of 100, and the empty one after
    store.close()

    # A start cut short after the copy, before its marker: nothing copied again.
    (tmp_path / "faiss" / lite_migration.MARKER).unlink()
    store = Store(str(tmp_path / "faiss"))
    FakeMilvusLite.collection = old = FakeOldCollection(1050)
    lite_migration.migrate(str(tmp_path), store)
    assert old.queries == [(None, None, 0)]
    assert store.get("u_alice", "c1").count() == 1050
    store.close()


async def test_ids_of_any_characters_are_paged_through_milvus_lite(tmp_path, monkeypatch):
    """The page's filter names the last id copied: quotes, backslashes, line breaks and
    characters past ASCII (Milvus Lite's filters know no \\u escape) page as any."""
    from gpulab.service.vectors import lite_migration
    from gpulab.service.vectors.embedded_store import Store
    from gpulab.service.vectors.engine import VectorEngine

    for name in ("PAGE_MIN", "PAGE_MAX", "PAGE"):
        monkeypatch.setattr(lite_migration, name, 2, raising=False)
    ids = [
        'a"b',
        "a\\b",
        "a'b",
        "é",
        "\U0001f600",
        "a\nb",
        "a\rb",
        "a b",
        "Z",
        "a",
        "\x01",
        'x\\"y',
    ]
    root = tmp_path / "vectors"
    old = OldEngine(str(root))
    engine = VectorEngine(old.uri)
    try:
        await engine.create("alice", "c1", DIM, "cosine", "hnsw")
        vectors = unit_vectors(len(ids), 4)
        await engine.write(
            "alice",
            "c1",
            [
                {"id": i, "vector": v, "metadata": {"i": i}}
                for i, v in zip(ids, vectors, strict=True)
            ],
            upsert=True,
        )
    finally:
        engine.close()
        old.close()
    store = Store(str(root / "faiss"))
    try:
        assert lite_migration.migrate(str(root), store) == len(ids)
        (db,) = {db for db, _ in store.names()}
        copied = store.get(db, "c1")
        assert sorted(copied.existing(ids)) == sorted(ids)
        assert {m["i"] for m in copied.metadata} == set(ids)
    finally:
        store.close()


def test_the_start_limit_waits_for_a_copy_that_goes_on(tmp_path, monkeypatch):
    """The service gave the engine 300 s to start, a copy from Milvus Lite included:
    one that took longer was killed, and began again at the next start. The limit now
    counts from the copy's last page."""
    import threading
    import time

    from gpulab.service.vectors import engine_process
    from gpulab.service.vectors.engine_process import EngineProcess

    process = EngineProcess(str(tmp_path))
    process.socket_dir = str(tmp_path)
    process.proc = SimpleNamespace(poll=lambda: None)
    progress = tmp_path / "vectors" / "faiss" / "lite-migration.json"
    progress.parent.mkdir(parents=True)
    (tmp_path / "engine.sock").touch()
    copied = threading.Event()
    monkeypatch.setattr(engine_process.engine_transport, "answers", lambda *a: copied.is_set())

    def copy(pages: int):  # a page every 0.1 s, 1.2 s in all: past the 0.5 s limit
        for i in range(pages):
            progress.write_text(str(i))
            time.sleep(0.1)

    def copy_then_answer():
        copy(12)
        copied.set()

    worker = threading.Thread(target=copy_then_answer)
    started = time.monotonic()
    worker.start()
    process.wait_ready(timeout=0.5)
    assert time.monotonic() - started > 1.0
    worker.join()
    # A copy that stopped moving: the limit holds from its last page.
    copied.clear()
    worker = threading.Thread(target=copy, args=(3,))
    started = time.monotonic()
    worker.start()
    with pytest.raises(RuntimeError, match="did not answer within 0.5 s"):
        process.wait_ready(timeout=0.5)
    assert 0.6 < time.monotonic() - started < 5
    worker.join()
    # The file the service watches is the one the copy writes.
    from gpulab.service.vectors import engine_server, lite_migration
    from gpulab.service.vectors.engine_process import MIGRATION_PROGRESS

    assert os.path.join(engine_server.FOLDER, lite_migration.PROGRESS) == MIGRATION_PROGRESS
