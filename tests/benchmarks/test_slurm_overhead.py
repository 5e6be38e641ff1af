"""benchmarks/slurm_overhead.py --quick: one round on its own 2-node Slurm sandbox
against the local backend; it must print its table with both backends and the ratios
(the figures themselves are the full run's to report, not this test's to bound)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "slurm_overhead.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("slurmctld"),
        reason="needs root and slurm-wlm + munge",
    ),
]


def test_quick_run_prints_both_backends_and_the_ratios():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for backend in ("local", "slurm"):
        row = re.search(rf"^{backend}\s+1\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+25$", out, re.M)
        assert row, out
        assert float(row.group(1)) > 0 and float(row.group(2)) > 0
    assert re.search(r"time to first step slurm/local = \d+\.\d{3}", out)
    assert re.search(r"step time\s+slurm/local = \d+\.\d{3} .*\(aim <= 1\.05\)", out)
