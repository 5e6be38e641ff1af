"""How ``vector_search.py`` measures a system, shared with the engines it runs in a
scratch virtualenv (:mod:`_vector_others`): numpy and threads only."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

K = 10
DIM = 384
M, EF_CONSTRUCTION, EF_SEARCH = 16, 200, 64


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(system: str, load: Callable, queries: np.ndarray, clients: int, budget_s: float):
    """``load()`` (empty to every row indexed; it returns the one-query search function,
    query vector -> row numbers, or that and the seconds until every row was
    acknowledged and searchable, where a system indexes behind its writes), then one
    pass over the queries with one client (latencies, and the answers recall comes
    from) and one with ``clients`` threads, each pass stopping after ``budget_s``
    seconds if the queries last longer."""
    start = time.perf_counter()
    loaded = load()
    load_s = time.perf_counter() - start
    search, acked_s = loaded if isinstance(loaded, tuple) else (loaded, load_s)
    progress(f"{system}: rows acknowledged in {acked_s:.1f}s, indexed in {load_s:.1f}s")
    search(queries[0])  # first-call costs (a client's lazy imports) are not a query's
    answers, latencies, qps_one = query_pass(search, queries, 1, budget_s)
    _, _, qps_many = query_pass(search, queries, clients, budget_s)
    progress(f"{system}: {qps_one:.1f} q/s, {qps_many:.1f} q/s with {clients} clients")
    return {
        "load_s": load_s,
        "acked_s": acked_s,
        "answers": answers,
        "p50_ms": float(np.percentile(latencies, 50)) * 1000,
        "p99_ms": float(np.percentile(latencies, 99)) * 1000,
        "qps_one": qps_one,
        "qps_many": qps_many,
    }


def query_pass(search: Callable, queries: np.ndarray, clients: int, budget_s: float):
    """``clients`` threads take the queries in turn until all are answered or the
    budget is spent: (answers by query, None where not reached; latencies; queries/s)."""
    answers: list = [None] * len(queries)
    latencies: list[float] = []
    taken = itertools.count()  # next() on it is atomic under the GIL
    start = time.perf_counter()
    deadline = start + budget_s

    def client() -> None:
        while time.perf_counter() < deadline and (i := next(taken)) < len(queries):
            t = time.perf_counter()
            answers[i] = [int(x) for x in search(queries[i])]
            latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return answers, latencies, sum(a is not None for a in answers) / elapsed
