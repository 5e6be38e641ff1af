"""The embedded engine's collections on real files: what was written is there after a
crash (no clean close) and a restart, upserts replace, deletes stay deleted, a torn
last record is dropped, snapshots fold the log, and a filter keeps k hits when k rows
match (searched exactly or through the index restricted to the matching rows)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpulab.service.vectors import faiss_collection
from gpulab.service.vectors.faiss_collection import Collection
from gpulab.service.vectors.filter_match import predicate
from gpulab.service.vectors.filters import parse

DIM = 16


def unit(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def ids_of(hits) -> list[str]:
    return [h[0] for h in hits]


def test_rows_survive_a_crash_with_upserts_and_deletes(tmp_path):
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "cosine", "hnsw")
    v = unit(300)
    c.write([f"r{i}" for i in range(200)], v[:200], [{"n": i} for i in range(200)])
    c.snapshot()  # half in a snapshot, half in the log after it
    c.write([f"r{i}" for i in range(200, 300)], v[200:], [{"n": i} for i in range(200, 300)])
    c.write(["r5"], v[299:300], [{"n": -5}])  # an upsert: r5 is now row 299's vector
    c.delete(["r7", "r250", "nope"])
    # No close, no snapshot: as after kill -9.
    again = Collection.open(path)
    assert again.count() == 298
    assert again.existing(["r5", "r7", "r250", "r299"]) == ["r5", "r299"]
    hits = again.search(v[299:300], 2)[0]
    assert sorted(ids_of(hits)) == ["r299", "r5"]
    assert {h[2]["n"] for h in hits} == {299, -5}
    assert "r7" not in ids_of(again.search(v[7:8], 5)[0])


def test_a_torn_last_record_is_dropped_and_the_log_goes_on(tmp_path):
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "l2", "flat")
    v = unit(20)
    c.write([f"r{i}" for i in range(10)], v[:10], [{}] * 10)
    log = c.log.path
    c.close()
    with open(log, "ab") as f:  # a write cut short by the crash: never acknowledged
        f.write(b"\x40\x00\x00\x00garbage")
    again = Collection.open(path)
    assert again.count() == 10
    again.write([f"r{i}" for i in range(10, 20)], v[10:], [{}] * 10)
    assert Collection.open(path).count() == 20
    # L2 scores are squared distances: the row itself is at 0.
    hit = Collection.open(path).search(v[12:13], 1)[0][0]
    assert hit[0] == "r12" and hit[1] == pytest.approx(0, abs=1e-5)


def test_a_snapshot_folds_the_log_and_drops_what_deletes_left(tmp_path):
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "cosine", "hnsw")
    v = unit(100)
    c.write([f"r{i}" for i in range(100)], v, [{}] * 100)
    c.delete([f"r{i}" for i in range(60)])
    c.snapshot()
    names = sorted(os.listdir(path))
    assert names == ["schema.json", "snap-2", "wal-2"]
    assert os.path.getsize(os.path.join(path, "wal-2")) == 0
    again = Collection.open(path)
    assert again.count() == 40 and len(again.ids) == 40  # rebuilt with the live rows only
    assert ids_of(again.search(v[70:71], 1)[0]) == ["r70"]


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_a_filter_returns_k_hits_that_all_match(tmp_path, monkeypatch, exact_below):
    """Through the index with a selector (exact_below 0) or exactly over the matches."""
    monkeypatch.setattr(faiss_collection, "EXACT_BELOW", exact_below)
    c = Collection.create(str(tmp_path / "c1"), DIM, "ip", "hnsw")
    v = unit(2000)
    meta = [{"lang": ("en", "de", "fr")[i % 3], "n": i} for i in range(2000)]
    c.write([f"r{i}" for i in range(2000)], v, meta)
    match = predicate(parse('metadata["lang"] == "de" and metadata["n"] < 1500'))
    hits = c.search(v[:3], 10, match)
    for found in hits:
        assert len(found) == 10
        assert all(h[2]["lang"] == "de" and h[2]["n"] < 1500 for h in found)
    # The best match of a query that is a matching row is that row.
    assert ids_of(c.search(v[1:2], 1, match)[0]) == ["r1"]
    assert c.search(v[:1], 5, predicate(parse('metadata["lang"] == "xx"'))) == [[]]


def test_filters_follow_milvus_semantics_over_json():
    rows = [
        ("a", {"n": 1, "s": "intro to x", "tags": ["x", "y"], "deep": {"k": True}}),
        ("b", {"n": 2.5, "s": 7, "tags": "x"}),
        ("c", {}),
    ]

    def matching(text):
        p = predicate(parse(text))
        return [rid for rid, meta in rows if p(rid, meta)]

    assert matching('metadata["n"] > 1') == ["b"]
    assert matching('metadata["n"] != 1') == ["b"]  # a missing key matches no comparison
    assert matching('not (metadata["n"] == 1)') == ["b", "c"]
    assert matching('metadata["s"] like "intro%"') == ["a"]
    assert matching('metadata["s"] like "%t_ x"') == ["a"]
    assert matching('json_contains(metadata["tags"], "x")') == ["a"]
    assert matching('json_contains_all(metadata["tags"], ["x", "y"])') == ["a"]
    assert matching('metadata["deep"]["k"] == true') == ["a"]
    assert matching('metadata["deep"]["k"] == 1') == []  # a boolean is not a number
    assert matching('id in ["b", "c"] and metadata["n"] in [2.5]') == ["b"]
    assert matching('metadata["tags"][1] == "y"') == ["a"]
