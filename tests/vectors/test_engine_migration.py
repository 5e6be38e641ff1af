"""An upgrade from the Milvus Lite engine: the first start of the FAISS engine copies
every row of every collection the old one held (ids, vectors, metadata, the metric
and index) and the service finds them all, as before."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent import futures

import numpy as np
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
