"""benchmarks/endpoint_overhead.py end to end with small numbers: a real hub, one
deployment, the replica and the hub path in one round; with ``--tls`` a second hub
(``gpulab up --tls self-signed``) called over https beside it. (LitServe comes with
`make bench-deps`, not with the tests' dependencies: the run without it is what
CI can check.)"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "endpoint_overhead.py"

pytestmark = pytest.mark.slow


def test_one_small_round_with_tls_prints_every_target_and_the_ratios():
    # One run covers both: --tls adds the https hub beside the plain one (two hubs
    # start; a run without --tls would start the plain one again).
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tls",
            "--requests",
            "100",
            "--warmup",
            "32",
            "--rounds",
            "1",
            "--dims",
            "64,128,10",
            "--no-litserve",
        ],
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The https target calls the second hub's endpoint on its https port.
    url = next(line for line in lines if line.startswith("through the hub, https: "))
    assert re.fullmatch(
        r"through the hub, https: https://127\.0\.0\.1:\d+/.+/v2/models/mlp/infer", url
    ), url
    plain = next(line for line in lines if line.startswith("through the hub: "))
    assert plain.split(": ", 1)[1].startswith("http://127.0.0.1:"), plain
    for target in ("replica directly (anchor 1)", "through the hub ", "through the hub, https "):
        row = next(line for line in lines if line.startswith(target))
        assert row.split()[-2] == "0", row  # no failed calls
    assert re.search(
        r"^https / http \(per call\): p50 \d+\.\d\dx, p99 \d+\.\d\dx, throughput \d+\.\d\dx "
        r"\(goal: TLS costs <= 1\.15x per call: (met|not met)\)$",
        done.stdout,
        re.M,
    ), done.stdout
    assert re.search(r"hub / replica directly: throughput \d+\.\d\dx", done.stdout)
    assert "LitServe skipped: --no-litserve" in done.stdout and "hub / LitServe" not in done.stdout
