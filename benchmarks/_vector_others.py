"""The engines of ``vector_search.py`` that live in a scratch virtualenv of their own
(their pins clash with gpulab's: Milvus Lite 2.5 wants pymilvus 2.5 and
``setuptools<70``): usearch, Milvus Lite 2.5, LanceDB. Run by ``vector_search.py``
with that virtualenv's python; reads the vectors and queries it saved, measures as it
does (the same functions, :mod:`_vector_measure`), prints one JSON line.

    <venv>/bin/python benchmarks/_vector_others.py SYSTEM DATA_DIR CLIENTS BUDGET
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _vector_measure import DIM, EF_CONSTRUCTION, EF_SEARCH, K, M, measure  # noqa: E402


def load_usearch(vectors: np.ndarray):
    from usearch.index import Index

    index = Index(
        ndim=DIM,
        metric="cos",
        connectivity=M,
        expansion_add=EF_CONSTRUCTION,
        expansion_search=EF_SEARCH,
    )
    index.add(np.arange(len(vectors)), vectors)
    return lambda q: index.search(q, K).keys.tolist()


def load_milvus_lite(vectors: np.ndarray):
    from pymilvus import DataType, MilvusClient

    folder = tempfile.mkdtemp(prefix="bench-milvus25-")
    client = MilvusClient(os.path.join(folder, "milvus.db"))
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    index = client.prepare_index_params()
    # Its local mode takes FLAT, IVF_FLAT and AUTOINDEX only (HNSW is refused).
    index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
    client.create_collection("bench", schema=schema, index_params=index)
    for lo in range(0, len(vectors), 2000):  # 10,000 rows per call hung its client
        batch = vectors[lo : lo + 2000].tolist()
        client.insert("bench", [{"id": lo + i, "vector": v} for i, v in enumerate(batch)])
    client.flush("bench")
    params = {"metric_type": "COSINE"}

    def search(q):
        hits = client.search("bench", data=[q.tolist()], limit=K, search_params=params)[0]
        return [h["id"] for h in hits]

    return search


def load_lancedb(vectors: np.ndarray):
    import lancedb
    import pyarrow as pa

    folder = tempfile.mkdtemp(prefix="bench-lancedb-")
    db = lancedb.connect(folder)
    table = None
    for lo in range(0, len(vectors), 10_000):
        chunk = vectors[lo : lo + 10_000]
        batch = pa.table(
            {
                "id": pa.array(np.arange(lo, lo + len(chunk))),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(chunk.reshape(-1)), DIM),
            }
        )
        if table is None:
            table = db.create_table("bench", data=batch)
        else:
            table.add(batch)
    table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ")

    def search(q):
        rows = table.search(q).metric("cosine").limit(K).select(["id"]).to_arrow()
        return rows.column("id").to_pylist()

    return search


LOADERS = {"usearch": load_usearch, "milvus-lite-2.5": load_milvus_lite, "lancedb": load_lancedb}


def main() -> int:
    system, data_dir, clients, budget = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    vectors = np.load(os.path.join(data_dir, "vectors.npy"))
    queries = np.load(os.path.join(data_dir, "queries.npy"))
    start = time.perf_counter()
    result = measure(system, lambda: LOADERS[system](vectors), queries, clients, budget)
    result["wall_s"] = time.perf_counter() - start
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
