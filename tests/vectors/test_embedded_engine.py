"""The embedded engine's collections on real files: what was written is there after a
crash (no clean close) and a restart, upserts replace, deletes stay deleted, a torn
last record is dropped, snapshots fold the log, and a filter keeps k hits when k rows
match (searched exactly or through the index restricted to the matching rows)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

from gpulab.service.vectors import faiss_collection
from gpulab.service.vectors import indexer as indexer_module
from gpulab.service.vectors.embedded_store import Store
from gpulab.service.vectors.engine import database_of
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


def _fail_once(monkeypatch, name: str, before=None):
    """``os.<name>`` raises ENOSPC at its next call (after ``before(args)``), then works."""
    from gpulab.service.vectors import wal

    real = getattr(wal.os, name)
    calls = []

    def failing(*args):
        if calls:
            return real(*args)
        calls.append(args)
        if before is not None:
            before(real, *args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal.os, name, failing)
    return calls


def test_a_write_that_failed_part_way_leaves_the_log_as_before(tmp_path, monkeypatch):
    """A full disk cut a record short, or its fsync failed: the write is refused, and
    the log is cut back, so the acknowledged writes after it survive a restart (replay
    stopped at the half record and cut them off; a whole unsynced one took the next
    write's sequence number, which replay then skipped)."""
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "l2", "flat")
    v = unit(5)
    c.write(["a"], v[0:1], [{}])

    def half(real, fd, data):  # half the record reaches the file, then the disk is full
        real(fd, bytes(data[: len(data) // 2]))

    _fail_once(monkeypatch, "write", half)
    with pytest.raises(OSError, match="No space left"):
        c.write(["b"], v[1:2], [{}])
    c.write(["c"], v[2:3], [{}])
    _fail_once(monkeypatch, "fdatasync")
    with pytest.raises(OSError, match="No space left"):
        c.write(["d"], v[3:4], [{}])
    c.write(["e"], v[4:5], [{}])
    assert c.existing(list("abcde")) == ["a", "c", "e"]
    again = Collection.open(path)
    assert again.existing(list("abcde")) == ["a", "c", "e"]
    assert ids_of(again.search(v[4:5], 1)[0]) == ["e"]


def test_a_log_that_cannot_be_cut_back_takes_no_more_writes(tmp_path, monkeypatch):
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "l2", "flat")
    v = unit(3)
    c.write(["a"], v[0:1], [{}])
    _fail_once(monkeypatch, "fdatasync")
    _fail_once(monkeypatch, "ftruncate")
    with pytest.raises(OSError, match="No space left"):
        c.write(["b"], v[1:2], [{}])
    with pytest.raises(OSError, match="could not be cut off the log") as refused:
        c.write(["c"], v[2:3], [{}])
    assert "no more writes until the vector engine restarts" in str(refused.value)
    assert c.existing(["a", "b", "c"]) == ["a"]
    # Reopened (the engine restarted), it writes again.
    again = Collection.open(path)
    again.write(["c"], v[2:3], [{}])
    assert Collection.open(path).existing(["a", "c"]) == ["a", "c"]


def test_a_snapshot_at_the_last_write_is_taken_again_once_indexed(tmp_path):
    """A bulk load whose log folded at its last write, before the index caught up (seen
    at 1,000,000 vectors): once the index has, the snapshot is taken again without the
    rows that waited, with no write after it, so a restart does not index them again."""
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "l2", "hnsw")
    v = unit(301)
    c.write([f"r{i}" for i in range(300)], v[:300], [{"n": i} for i in range(300)])
    c.idle = True  # the client's flush: writes paused
    c.snapshot()  # every row still waiting for the index
    assert os.path.getsize(os.path.join(path, "wal-1")) == 0
    assert not c.snapshot_due()  # not while the index is behind
    c.build()
    assert c.snapshot_due()
    c.snapshot()
    assert not c.snapshot_due()
    assert sorted(os.listdir(path)) == ["schema.json", "snap-2", "wal-2"]
    again = Collection.open(path)
    assert (again.index.ntotal, again.pending(), again.count()) == (300, 0, 300)
    # The next write goes on after that snapshot, and survives a crash.
    c.write(["r300"], v[300:], [{"n": 300}])
    again = Collection.open(path)
    assert (again.index.ntotal, again.pending(), again.count()) == (300, 1, 301)
    assert ids_of(again.search(v[300:301], 1)[0]) == ["r300"]


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


def test_json_contains_is_the_same_over_long_lists_and_mixed_kinds():
    """Each row's list is read once (a row may hold 30,000 items and a filter hundreds
    of values); what matches is as before: the same kind and value, 1 and 1.0 alike,
    never true for 1."""
    rng = np.random.default_rng(3)
    pool = [0, 1, 1.0, 2.5, True, False, "1", "a", "b", None, [1], {"k": 1}]
    rows = [(f"r{i}", {"t": [pool[j] for j in rng.integers(0, len(pool), 6)]}) for i in range(300)]
    rows += [("long", {"t": list(range(30_000))}), ("scalar", {"t": 1})]

    def kind(x):
        if isinstance(x, bool):
            return "bool"
        return "number" if isinstance(x, int | float) else "str" if isinstance(x, str) else "-"

    def naive(values, every):
        """Milvus's rule, word for word: every (or any) value is an item of the list."""
        for rid, meta in rows:
            t = meta["t"]
            if isinstance(t, list) and (all if every else any)(
                any(kind(x) == kind(v) != "-" and x == v for x in t) for v in values
            ):
                yield rid

    for text, values, every in (
        ('json_contains_any(metadata["t"], [1, "a"])', [1, "a"], False),
        ('json_contains_all(metadata["t"], [1, true])', [1, True], True),
        ('json_contains(metadata["t"], 2.5)', [2.5], False),
        ('json_contains_any(metadata["t"], [29999, -1])', [29999, -1], False),
        ('json_contains_all(metadata["t"], [false, "b", 0])', [False, "b", 0], True),
    ):
        p = predicate(parse(text))
        assert [rid for rid, meta in rows if p(rid, meta)] == list(naive(values, every)), text
    many = "[" + ",".join(str(v) for v in range(900)) + "]"  # as many as 4,096 characters hold
    p = predicate(parse(f'json_contains_all(metadata["t"], {many})'))
    assert [rid for rid, meta in rows if p(rid, meta)] == ["long"]


def test_a_filter_past_the_calls_time_is_stopped_in_the_engine_with_a_504(tmp_path):
    """The service gives a call up at its time limit; the engine stops the filter's
    work then too, rather than go on through every row for a caller who is gone."""
    from gpulab.service.vectors import engine_protocol as protocol
    from gpulab.service.vectors.engine_server import Handlers, handler

    store = Store(str(tmp_path))
    search = handler(Handlers(store).search)
    store.create("alice", "c1", DIM, "cosine", "flat")
    store.get("alice", "c1").write(
        [f"r{i}" for i in range(2000)], unit(2000), [{"n": i} for i in range(2000)]
    )
    header = {"db": "alice", "cid": "c1", "k": 5, "filter": 'metadata["n"] >= 0', "dim": DIM}
    answer, _ = protocol.unpack(search(protocol.pack({**header, "time_limit_s": 0.0}, unit(1))))
    assert answer["status"] == 504 and "still reading rows" in answer["error"]
    answer, _ = protocol.unpack(search(protocol.pack({**header, "time_limit_s": 30.0}, unit(1))))
    assert len(answer["results"][0]) == 5


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_rows_not_indexed_yet_are_found_hidden_and_filtered_with_the_indexed(
    tmp_path, monkeypatch, exact_below
):
    """A write is searchable before the index holds it (the tail, searched exactly):
    a search merges both parts, deletes and upserts hide rows in both, and a filter
    keeps k hits across both (through the index restricted to the matches, exact_below
    0, or exactly over the matches)."""
    monkeypatch.setattr(faiss_collection, "EXACT_BELOW", exact_below)
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "cosine", "hnsw")
    v = unit(400)
    meta = [{"lang": ("en", "de")[i % 2], "n": i} for i in range(400)]
    c.write([f"r{i}" for i in range(300)], v[:300], meta[:300])
    c.build()
    c.write([f"r{i}" for i in range(300, 400)], v[300:], meta[300:])
    assert (c.index.ntotal, c.pending()) == (300, 100)
    assert ids_of(c.search(v[350:351], 1)[0]) == ["r350"]  # read your writes
    assert ids_of(c.search(v[10:11], 1)[0]) == ["r10"]
    queries = unit(5, seed=1)
    exact = np.argsort(-(queries @ v.T), axis=1)[:, :10]
    found = c.search(queries, 10)
    for hits, best in zip(found, exact, strict=True):
        assert set(ids_of(hits)) == {f"r{i}" for i in best}
        assert [h[1] for h in hits] == sorted((h[1] for h in hits), reverse=True)
    # A delete in each part, and an indexed row replaced by a new vector (now in the tail).
    c.delete(["r10", "r350"])
    moved = -v[20:21]
    c.write(["r20"], moved, [{"lang": "de", "n": 1000}])
    assert "r10" not in ids_of(c.search(v[10:11], 5)[0])
    assert "r350" not in ids_of(c.search(v[350:351], 5)[0])
    assert "r20" not in ids_of(c.search(v[20:21], 5)[0])
    assert ids_of(c.search(moved, 1)[0]) == ["r20"]
    # Matches on both sides of the index's end: k hits, all matching, the tail's found.
    match = predicate(parse('metadata["lang"] == "de" and metadata["n"] >= 250'))
    for hits in c.search(np.vstack([v[261], v[353], moved[0]]), 10, match):
        assert len(hits) == 10
        assert all(h[2]["lang"] == "de" and h[2]["n"] >= 250 for h in hits)
    assert ids_of(c.search(v[353:354], 1, match)[0]) == ["r353"]
    assert ids_of(c.search(moved, 1, match)[0]) == ["r20"]


class _BreadthSpy:
    """The collection's FAISS index, noting the efSearch each search asked of it."""

    def __init__(self, index):
        self.index, self.asked = index, []

    def search(self, queries, k, params=None):
        self.asked.append(params.efSearch)
        return self.index.search(queries, k, params=params)

    def __getattr__(self, name):
        return getattr(self.index, name)


def test_a_search_goes_as_wide_as_asked_and_at_least_twice_k(tmp_path):
    """The service's c.VectorSettings.collection_search_ef reaches FAISS: a search's
    breadth is the ef asked (the engine's default without one), never under 2k; the
    engine refuses a breadth out of range, as a 400."""
    from gpulab.service.vectors.engine_server import search_ef

    c = Collection.create(str(tmp_path / "c1"), DIM, "cosine", "hnsw")
    v = unit(200)
    c.write([f"r{i}" for i in range(200)], v, [{} for _ in range(200)])
    c.build()
    c.index = spy = _BreadthSpy(c.index)
    assert ids_of(c.search(v[5:6], 1, ef=200)[0]) == ["r5"]
    assert ids_of(c.search(v[6:7], 1)[0]) == ["r6"]
    c.search(v[:1], 50, ef=16)
    assert spy.asked == [200, faiss_collection.EF_SEARCH, 100]
    assert search_ef(256) == 256
    for wrong in (0, 5000, 64.5, "64", True):
        with pytest.raises(ValueError, match="ef must be an integer"):
            search_ef(wrong)


async def test_the_service_sends_its_search_breadth_with_each_search():
    """EmbeddedEngine(search_ef=N) asks the engine for breadth N on every search, a
    batch of searches included; without it the engine's default holds."""
    from gpulab.service.vectors import engine_protocol as protocol
    from gpulab.service.vectors.embedded import EmbeddedEngine

    class Engine:
        def __init__(self):
            self.headers = []

        async def call(self, method, request):
            header, vectors = protocol.unpack(request)
            self.headers.append(header)
            return protocol.pack({"results": [[] for _ in vectors]})

    for breadth, expected in ((300, 300), (None, None)):
        engine = EmbeddedEngine("unix:/nowhere", search_ef=breadth)
        engine.client = fake = Engine()
        await asyncio.gather(
            *(
                engine.search("alice", "c1", [unit(1, seed=i)[0]], 10, "cosine", "")
                for i in range(3)
            )
        )
        assert fake.headers and all(h.get("ef") == expected for h in fake.headers)


def test_a_snapshot_keeps_the_index_built_so_far_and_the_rows_waiting(tmp_path):
    """Snapshots do not wait for the index: the part built is saved as built, the rest
    as the tail; a crash after more writes replays them into the tail too."""
    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "l2", "hnsw")
    v = unit(500)
    c.write([f"r{i}" for i in range(300)], v[:300], [{"n": i} for i in range(300)])
    c.index_some(100)
    c.snapshot()
    c.write([f"r{i}" for i in range(300, 500)], v[300:], [{"n": i} for i in range(300, 500)])
    # No close: as after kill -9 while the indexer was at work.
    again = Collection.open(path)
    assert (again.index.ntotal, again.pending(), again.count()) == (100, 400, 500)
    for i in (5, 150, 420):
        hit = again.search(v[i : i + 1], 1)[0][0]
        assert hit[0] == f"r{i}" and hit[2] == {"n": i} and hit[1] == pytest.approx(0, abs=1e-5)
    again.build()
    assert (again.index.ntotal, again.pending()) == (500, 0)
    assert ids_of(again.search(v[420:421], 1)[0]) == ["r420"]
    # Once writes paused and the index caught up, the snapshot that saved rows not
    # indexed then is taken again (a restart would index them once more).
    assert not again.snapshot_due()
    again.idle = True
    again.write(["r0"], v[:1], [{"n": 0}])
    assert not again.snapshot_due()  # a write: no longer paused
    again.idle = True
    again.build()
    assert again.snapshot_due()
    again.snapshot()
    assert not again.snapshot_due()
    assert (Collection.open(path).index.ntotal, Collection.open(path).pending()) == (501, 0)


def test_the_engines_indexer_builds_behind_the_writes_and_a_clean_stop_keeps_it(tmp_path):
    """The store's indexer thread indexes what is written; a clean stop snapshots it,
    so the next start replays no log and indexes nothing again."""
    store = Store(str(tmp_path / "engine"))
    c = store.create("db", "c1", DIM, "cosine", "hnsw")
    v = unit(3000)
    for start in range(0, 3000, 500):
        ids = [f"r{i}" for i in range(start, start + 500)]
        c.write(ids, v[start : start + 500], [{}] * 500)
    assert c.count() == 3000
    indexed = threading.Event()
    while c.pending():  # the indexer's pace: each step is a batch it indexed
        indexed.wait(0.05)
    assert c.index.ntotal == 3000
    # It runs nicer than the calls (its FAISS threads, started from it, too).
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    indexer = os.getpriority(os.PRIO_PROCESS, store.indexer._thread.native_id)
    assert indexer == min(19, mine + indexer_module.NICE)
    store.close()
    again = Store(str(tmp_path / "engine"))
    try:
        reopened = again.get("db", "c1")
        assert (reopened.index.ntotal, reopened.pending(), reopened.count()) == (3000, 0, 3000)
        assert os.path.getsize(reopened.log.path) == 0
        assert ids_of(reopened.search(v[2999:3000], 1)[0]) == ["r2999"]
    finally:
        again.close()


class EngineServer:
    """The engine's real process (as the service runs it) on a data dir of the test's."""

    def __init__(self, data: str, socket: str):
        self.data, self.socket = data, socket

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpulab.service.vectors.engine_server"]
            + [self.data, self.socket, str(os.getpid())],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().startswith("vector engine ready")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def test_a_second_engine_on_the_same_data_refuses_to_start(tmp_path):
    """Two engines on one data dir would both write its logs (and the older one could
    go on answering connections made before the newer took the socket): the second
    exits at once, naming the first; once the first is gone, an engine starts."""
    folder = tempfile.mkdtemp(prefix="gpulab-lock-")  # a socket's path must be short
    first = EngineServer(str(tmp_path / "data"), os.path.join(folder, "a.sock"))
    first.start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "gpulab.service.vectors.engine_server"]
            + [first.data, os.path.join(folder, "b.sock"), str(os.getpid())],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"another vector engine (pid {first.proc.pid}) serves" in second.stderr
        assert not os.path.exists(os.path.join(folder, "b.sock"))
        first.kill()
        again = EngineServer(first.data, os.path.join(folder, "b.sock"))
        again.start()
        again.kill()
    finally:
        first.kill()
        shutil.rmtree(folder, ignore_errors=True)


async def answered(call, tries: int = 50):
    """The call's answer once the client found the restarted engine (a 503 until then,
    as the service's callers get)."""
    from gpulab.service.vectors.engine import EngineError

    for _ in range(tries - 1):
        try:
            return await call()
        except EngineError as e:
            assert e.status == 503, e
            await asyncio.sleep(0.1)
    return await call()


async def test_a_kill_9_while_rows_wait_for_the_index_loses_no_acknowledged_row(tmp_path):
    """Writes are answered once in the log, before the index holds them. The engine is
    killed (SIGKILL) with acknowledged rows still waiting for its index; after a restart
    every acknowledged row is there and found by a search, deleted rows stay deleted,
    and the indexer takes up the rows the log replayed."""
    from gpulab.service.vectors.embedded import EmbeddedEngine

    dim, n = 384, 6000
    v = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    folder = tempfile.mkdtemp(prefix="gpulab-crash-")  # a socket's path must be short
    server = EngineServer(str(tmp_path / "data"), os.path.join(folder, "engine.sock"))
    server.start()
    client = EmbeddedEngine("unix:" + server.socket, call_timeout=60)
    try:
        await client.create("alice", "c1", dim, "cosine", "hnsw")
        acknowledged = []
        for start in range(0, n, 1000):
            rows = [
                {"id": f"r{i}", "vector": v[i], "metadata": {"n": i}}
                for i in range(start, start + 1000)
            ]
            await client.write("alice", "c1", rows, upsert=False)
            acknowledged += [r["id"] for r in rows]
        await client.delete("alice", "c1", ["r7", "r5999"])
        before = await client.stats("alice", "c1")
        assert before == {"count": n - 2, "pending_index_rows": before["pending_index_rows"]}
        assert before["pending_index_rows"] > 0  # killed with rows the index did not hold
        server.kill()
        server.start()
        after = await answered(lambda: client.stats("alice", "c1"))
        assert after["count"] == n - 2
        live = set(acknowledged) - {"r7", "r5999"}
        assert await client.existing("alice", "c1", acknowledged) == live
        for i in (0, 3000, 5998):
            hit = (await client.search("alice", "c1", [v[i]], 1, "cosine", ""))[0][0]
            assert hit["id"] == f"r{i}" and hit["metadata"] == {"n": i}
        hits = await client.search("alice", "c1", [v[5999]], 5, "cosine", "")
        assert "r5999" not in [h["id"] for h in hits[0]]
        pending = after["pending_index_rows"]
        while pending == after["pending_index_rows"]:  # the indexer is at work again
            pending = (await client.stats("alice", "c1"))["pending_index_rows"]
    finally:
        client.close()
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_search_whose_hits_would_be_too_large_is_refused_in_the_engine(tmp_path):
    """Each hit carries its row's metadata (up to 64 KiB) and the service reads the
    answer whole, on its event loop: 1,000 hits of such rows were 64 MB."""
    from gpulab.service.vectors import engine_protocol as protocol
    from gpulab.service.vectors.engine_server import MAX_SEARCH_REPLY, Handlers, handler

    handlers = Handlers(Store(str(tmp_path / "faiss")))
    head = {"db": "d", "cid": "c"}
    handlers.create({**head, "dim": DIM, "metric": "cosine", "index": "flat"}, None)
    fat = {"blob": "x" * 60_000}
    rows = 600  # 36 MB of metadata
    ids = [f"r{i}" for i in range(rows)]
    handlers.write({**head, "ids": ids, "metadata": [fat] * rows}, unit(rows))
    search = handler(handlers.search)

    def answer(k: int, queries: int) -> dict:
        request = protocol.pack({**head, "k": k, "dim": DIM}, unit(queries, seed=1))
        return protocol.unpack(search(request))[0]

    refused = answer(k=rows, queries=1)
    assert refused["status"] == 413 and "a smaller k" in refused["error"]
    assert refused["error"].startswith(
        f"the hits and their rows' metadata are over {MAX_SEARCH_REPLY >> 20} MiB"
    )
    # What fits is answered: 10 hits of the fat rows, and many hits of small ones.
    assert [len(hits) for hits in answer(k=10, queries=2)["results"]] == [10, 10]
    handlers.write({**head, "ids": ids, "metadata": [{"n": i} for i in range(rows)]}, unit(rows))
    assert [len(hits) for hits in answer(k=rows, queries=3)["results"]] == [rows] * 3


async def test_a_drop_is_sent_at_once_while_the_owners_searches_hold_her_slots():
    """A drop went through the owner's work queue: behind her running searches it
    waited out its time limit unsent (504), its row already gone, and its files stayed
    on the engine's disk for good."""
    from gpulab.service.vectors import engine_protocol as protocol
    from gpulab.service.vectors.embedded import PER_OWNER, EmbeddedEngine

    class Engine:
        def __init__(self):
            self.release = asyncio.Event()
            self.searching = 0
            self.dropped = []

        async def call(self, method, request):
            header, vectors = protocol.unpack(request)
            if method == "drop":
                self.dropped.append((header["db"], header["cid"]))
                return protocol.pack({})
            self.searching += 1
            await self.release.wait()
            return protocol.pack({"results": [[] for _ in vectors]})

    engine = EmbeddedEngine("unix:/nowhere")
    engine.client = fake = Engine()
    searches = [
        asyncio.create_task(engine.search("alice", f"c{i}", unit(1), 10, "cosine", ""))
        for i in range(PER_OWNER + 2)
    ]
    while fake.searching < PER_OWNER:  # her slots are all taken; two more wait
        await asyncio.sleep(0)
    await engine.drop("alice", "c9")
    assert fake.dropped == [(database_of("alice"), "c9")]
    assert fake.searching == PER_OWNER  # the drop took no slot of hers
    fake.release.set()
    await asyncio.gather(*searches)


async def test_the_start_names_the_engines_collections_no_row_names(tmp_path, caplog):
    """A drop removes the row first; if the engine's drop then failed (the engine down,
    the service stopped), the rows stayed on its disk, uncounted. The start names them
    for the admin and removes nothing: a database restored from a backup names fewer
    collections than the engine holds, and those must not be lost."""
    from types import SimpleNamespace

    from gpulab.service.vectors.checks import CollectionLimits
    from gpulab.service.vectors.embedded import EmbeddedEngine
    from gpulab.service.vectors.manager import CollectionManager

    folder = tempfile.mkdtemp(prefix="gpulab-sweep-")  # a socket's path must be short
    server = EngineServer(str(tmp_path / "data"), os.path.join(folder, "engine.sock"))
    server.start()
    engine = EmbeddedEngine("unix:" + server.socket)

    async def started():
        pass

    def manager(rows: list[dict]) -> CollectionManager:
        return CollectionManager(
            store=SimpleNamespace(list=lambda: rows),
            engine=engine,
            limits=CollectionLimits(max_rows=10, max_dim=DIM, max_per_user=3),
            embedder=None,
            endpoint_lineage=lambda owner, name: None,
            process=SimpleNamespace(start=started),
        )

    try:
        for owner, cid in (("alice", "c1"), ("alice", "c2"), ("bob", "c3"), ("bob", "c4")):
            await engine.create(owner, cid, DIM, "cosine", "flat")
        everything = sorted(await engine.held())
        with caplog.at_level("WARNING", logger="gpulab.service.vectors"):
            await manager([{"user": "alice", "id": "c1"}, {"user": "bob", "id": "c3"}]).ready()
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "holds 2 collections no row names" in said
        assert f"{database_of('alice')}/c2" in said and f"{database_of('bob')}/c4" in said
        assert "/c1" not in said and "/c3" not in said
        assert sorted(await engine.held()) == everything  # nothing removed
    finally:
        engine.close()
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_collection_opened_while_its_drop_runs_is_gone_not_opened_again(tmp_path):
    """A drop is sent at once, not behind its owner's calls: one of theirs that opens
    the collection while the drop waits (here, for an index build to end) finds it
    gone, and nothing of it stays open over the removed folder."""
    from gpulab.service.vectors.embedded_store import NotFound

    store = Store(str(tmp_path / "data"))
    collection = store.create("db", "c1", DIM, "cosine", "flat")
    store.drop("db", "c0")  # no such collection: nothing to do
    collection.builder.acquire()  # an index build under way: the drop's close waits
    dropping = threading.Thread(target=store.drop, args=("db", "c1"))
    dropping.start()
    try:
        wait = 0
        while store.opened() and wait < 500:  # the drop has taken it out of the open set
            threading.Event().wait(0.01)
            wait += 1
        got: list = []
        opener = threading.Thread(target=lambda: got.append(_get_or_error(store)))
        opener.start()
        opener.join(0.5)
    finally:
        collection.builder.release()
    dropping.join(30)
    opener.join(30)
    assert isinstance(got[0], NotFound), got
    assert store.opened() == []
    assert not os.path.exists(store.path("db", "c1"))
    store.close()


def _get_or_error(store):
    try:
        return store.get("db", "c1")
    except Exception as e:
        return e


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_an_exact_search_reads_its_matching_rows_a_chunk_at_a_time(tmp_path, monkeypatch, metric):
    """A filtered search of a flat collection copied every matching row's vector at
    once (4 GB at 1,000,000 rows of 1,024-d); now in chunks of EXACT_CHUNK_BYTES, with
    the same hits as one pass over them all."""
    from gpulab.service.vectors import tail as tail_module

    c = Collection.create(str(tmp_path / "c1"), DIM, metric, "flat")
    v = unit(3000)
    meta = [{"n": i, "keep": i % 3 != 0} for i in range(3000)]
    c.write([f"r{i}" for i in range(2000)], v[:2000], meta[:2000])
    c.build()  # two thirds in the index, a third in the tail
    c.write([f"r{i}" for i in range(2000, 3000)], v[2000:], meta[2000:])
    match = predicate(parse('metadata["keep"] == true'))
    queries = unit(3, seed=1)
    whole = c.search(queries, 20, match)
    gathered = []
    gather = c._gather  # noqa: SLF001 - the copies it makes are what is measured

    def counted(labels):
        gathered.append(len(labels))
        return gather(labels)

    monkeypatch.setattr(c, "_gather", counted)
    rows = 128
    chunk = 4 * (DIM + 3 * len(queries)) * rows
    monkeypatch.setattr(tail_module, "EXACT_CHUNK_BYTES", chunk, raising=False)
    chunked = c.search(queries, 20, match)
    assert max(gathered) == rows and sum(gathered) == 2000
    assert [ids_of(h) for h in chunked] == [ids_of(h) for h in whole]
    scores = [[h[1] for h in hits] for hits in chunked]
    assert np.allclose(scores, [[h[1] for h in hits] for hits in whole])
    assert all(h[2]["n"] % 3 for hits in chunked for h in hits)


def test_an_insert_of_an_id_held_already_writes_nothing(tmp_path):
    """An insert's ids are looked for under the collection's write lock, in the step
    that writes them (the service looked first and wrote after: two at once both
    found none)."""
    from gpulab.service.vectors.faiss_collection import IdsTaken

    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "cosine", "flat")
    v = unit(3)
    c.write(["a", "b"], v[:2], [{"n": 0}, {"n": 1}], new_only=True)
    with pytest.raises(IdsTaken) as taken:
        c.write(["c", "b"], v[1:], [{}, {}], new_only=True)
    assert taken.value.ids == ["b"]
    assert (c.count(), c.seq) == (2, 1)  # nothing of it in the log either
    c.write(["b"], v[2:], [{"n": 2}])  # an upsert replaces it
    again = Collection.open(path)
    assert again.count() == 2 and ids_of(again.search(v[2:3], 1)[0]) == ["b"]


def test_what_a_collections_rows_cost_is_kept_through_writes_deletes_and_a_restart(tmp_path):
    """One user's byte budget counts what the engine says their rows cost: counted once,
    then kept by each write, upsert and delete (a pass over the rows each time would
    hold writes for seconds)."""
    from gpulab.service.vectors.row_cost import rows_cost

    def cost_of(c: Collection) -> int:
        return rows_cost(DIM, [m for m in c.metadata if m is not None])

    path = str(tmp_path / "c1")
    c = Collection.create(path, DIM, "cosine", "hnsw")
    v = unit(50)
    c.write([f"r{i}" for i in range(20)], v[:20], [{"n": i, "tags": ["x"] * i} for i in range(20)])
    assert c.held_bytes() == cost_of(c)
    c.write([f"r{i}" for i in range(10, 30)], v[20:40], [{"t": "y" * i} for i in range(20)])
    c.write(["d", "d"], v[40:42], [{"first": 1}, {"second": [1, 2, 3]}])  # the last one wins
    c.delete(["r0", "r25", "nope"])
    c.snapshot()  # a rebuild too, after deletes: the cost is the live rows'
    c.write(["e"], v[42:43], [{}])
    assert c.count() == 30
    assert c.held_bytes() == cost_of(c)
    assert Collection.open(path).held_bytes() == cost_of(c)
