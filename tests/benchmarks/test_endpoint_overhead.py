"""benchmarks/endpoint_overhead.py end to end with small numbers: a real hub, one
deployment, the replica and the hub path in one round. (LitServe comes with
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


def test_one_small_round_without_litserve_prints_the_targets_and_the_ratio():
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
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
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for target in ("replica directly (anchor 1)", "through the hub"):
        row = next(line for line in out.splitlines() if line.startswith(target))
        assert row.split()[-2] == "0", row  # no errors
    assert re.search(r"hub / replica directly: throughput \d+\.\d\dx", out)
    assert "LitServe skipped: --no-litserve" in out and "hub / LitServe" not in out
