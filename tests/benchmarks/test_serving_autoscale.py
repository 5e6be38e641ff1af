"""benchmarks/serving_autoscale.py end to end with short phases: on the suite's shared
hub (``--hub``: a hub of its own would start for this test alone), fixed 3 replicas then
an autoscaled deployment under the 8 -> 64 -> 8 clients step."""

import subprocess
import sys
from pathlib import Path

import pytest
from hubproc import fresh_user

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "serving_autoscale.py"

pytestmark = pytest.mark.slow


def test_short_step_load_scales_up_and_is_reported(plain_hub):
    token = plain_hub.create_user(fresh_user("bench"))
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--hub",
            plain_hub.url,
            "--token",
            token,
            "--fixed",
            "3",
            # B long enough for the autoscaler (a look a second) to add replicas and
            # its mean to show them; A and C only need rows of their own.
            "--phases",
            "2,6,2",
            "--warmup",
            "0",
            "--scale-down-delay",
            "3",
            "--dims",
            "64,128,10",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if line.startswith(("fixed 3", "autoscaled 1..3")) and parts[2] in ("A", "B", "C"):
            label = " ".join(parts[:2])
            rows[(label, parts[2])] = parts
            assert parts[-2] == "0", line  # no errors
    assert len(rows) == 6, out
    assert float(rows[("fixed 3", "B")][-1]) == pytest.approx(3, abs=0.01)
    # 64 clients at 16 calls per replica: the autoscaler asked for more than one.
    assert float(rows[("autoscaled 1..3", "B")][-1]) > 1.2, out
    assert "replicas wanted(ready) over time, autoscaled 1..3: A@0s" in out
    assert "autoscaled 1..3 / fixed 3: p99 " in out and "slice-seconds " in out
