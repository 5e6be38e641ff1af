"""benchmarks/endpoint_overhead.py end to end with small numbers: a real hub, one
deployment, the three targets (the replica, the hub path, LitServe) in one round."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "endpoint_overhead.py"

pytestmark = pytest.mark.slow


def test_one_small_round_prints_every_target_and_the_ratios():
    pytest.importorskip("litserve")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--requests",
            "200",
            "--warmup",
            "64",
            "--rounds",
            "1",
            "--dims",
            "64,128,10",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for target in ("replica directly (anchor 1)", "through the hub", "LitServe (anchor 2)"):
        row = next(line for line in out.splitlines() if line.startswith(target))
        assert row.split()[-2] == "0", row  # no errors
    # The replica's batch histogram was read for both of its targets.
    direct = next(line for line in out.splitlines() if line.startswith("replica directly"))
    assert float(direct.split()[-1]) >= 1
    assert re.search(r"hub / replica directly: throughput \d+\.\d\dx", out)
    assert re.search(r"hub / LitServe: throughput \d+\.\d\dx", out)


def test_no_litserve_says_it_was_skipped():
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
    assert "LitServe skipped: --no-litserve" in done.stdout
    assert "LitServe (anchor 2)" not in done.stdout
    assert "hub / LitServe" not in done.stdout
