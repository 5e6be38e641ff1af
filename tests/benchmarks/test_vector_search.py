"""benchmarks/vector_search.py end to end with small numbers and the in-process
systems (no hub): the synthetic set's table, the anchor's recall by efSearch, the row
at gpulab's efSearch on the anchor's graph, and a gpulab row said skipped without a
hub, not silently left out; the client floor's server hands back every query's exact
answer over the same client."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "vector_search.py"


def test_a_small_synthetic_run_prints_every_row_and_the_recall_by_ef():
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--n",
            "3000",
            "--queries",
            "50",
            "--clusters",
            "50",
            "--datasets",
            "synthetic",
            "--systems",
            "exact,faiss-hnsw,faiss-hnsw-ef,gpulab,client-floor",
            "--gpulab-ef",
            "32",
            "--budget",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "synthetic: 3000 clustered vectors (50 clusters, 24-d local spread 0.2" in out
    by_ef = re.search(r"recall@10 by efSearch \(M 16\): ef 16: ([\d.]+).* ef 1024: ([\d.]+)", out)
    assert by_ef and 0 < float(by_ef[1]) <= float(by_ef[2]) <= 1, out
    assert out.count("recall@10 by efSearch") == 1  # the ef row searches the same graph
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines()}
    assert rows["exact: FAISS flat"][2] == "1.0000"
    assert rows["FAISS HNSW (anchor)"][3] == "50"  # every query answered
    assert rows["FAISS HNSW, ef 32 (gpulab's)"][:2] == ["-", "-"]  # nothing loaded
    assert rows["gpulab REST (engine)"][0] == "skipped:"
    # The floor's server answers each query's own body with its exact top 10, at once.
    assert rows["client floor (searches nothing)"][:4] == ["-", "-", "1.0000", "50"]
    floor = re.search(r"client floor: 8 clients reach (\d+) q/s .* ([\d.]+)x the anchor", out)
    assert floor and int(floor[1]) > 0, out
