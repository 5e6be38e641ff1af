"""benchmarks/priority_replay.py: the replay on a tiny synthetic cluster and trace,
checked as a reader of its table would check it, and the CLI on the real trace."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.scheduler.policy import Request

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "priority_replay.py"
TRACES = Path(
    os.environ.get("GPULAB_TRACES", REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023")
)


def _load():
    spec = importlib.util.spec_from_file_location("priority_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["priority_replay"] = module
    spec.loader.exec_module(module)
    return module


pr = _load()

ONE_GPU = Request(gpu_milli=1000, num_gpu=1, cpu_milli=1000, memory_mib=1024)
NODES = [("n0", 8000, 16384, ["T4", "T4"])]
CONFIG = pr.Config(checkpoint_interval=3600, grace=30, step=10, save=5, placement="best-fit")


def contended_trace():
    """Two batch pods fill the node; a high pod comes when they differ in what they'd lose.

    At t=3700 "old" (started at 0) checkpointed 100 s ago, "new" (started at 3000)
    has 700 s unsaved: kueue-classic takes the newest, gpulab the one losing least.
    """
    return [
        pr.Arrival(0.0, ONE_GPU, False, 10_000.0),  # old
        pr.Arrival(3000.0, ONE_GPU, False, 10_000.0),  # new
        pr.Arrival(3700.0, ONE_GPU, True, 100.0),  # the high pod
    ]


def run(scheme):
    return pr.replay(NODES, contended_trace(), scheme, CONFIG, horizon=8000.0)


def test_preemption_cuts_the_high_wait():
    waits = {s: run(s).high_wait_p99 for s in pr.SCHEMES}
    # Without preemption it waits to the horizon (no batch pod ends before it).
    assert waits["priority"] == pytest.approx(4300.0)
    assert waits["fifo"] == pytest.approx(4300.0)
    assert waits["kueue-classic"] == pytest.approx(30.0)  # the grace
    assert waits["gpulab"] == pytest.approx(15.0)  # the step in flight + the save
    assert waits["gpulab"] < waits["priority"] and waits["kueue-classic"] < waits["priority"]


def test_gpulab_loses_less_than_kueue_classic_when_their_victims_differ():
    kueue, gpulab = run("kueue-classic"), run("gpulab")
    assert kueue.preemptions == gpulab.preemptions == 1
    assert kueue.lost_gpu_h == pytest.approx(730 / 3600)  # 700 s unsaved + the grace
    assert gpulab.lost_gpu_h == pytest.approx(15 / 3600)
    assert gpulab.lost_gpu_h < kueue.lost_gpu_h


def test_fifo_and_priority_never_preempt():
    for scheme in ("fifo", "priority"):
        result = run(scheme)
        assert result.preemptions == 0 and result.lost_gpu_h == 0


def test_a_victim_requeues_with_its_remaining_work_and_finishes():
    # A short victim: it restarts once the high pod is done and finishes in the horizon.
    trace = [
        pr.Arrival(0.0, ONE_GPU, False, 500.0),
        pr.Arrival(0.0, ONE_GPU, False, 5000.0),
        pr.Arrival(100.0, ONE_GPU, True, 50.0),
    ]
    result = pr.replay(NODES, trace, "kueue-classic", CONFIG, horizon=2000.0)
    # newest-first picks either batch pod (both started at 0); the short one has
    # no checkpoint, so it redoes 130 s and finishes after the high pod leaves.
    assert result.preemptions == 1 and result.batch_finished >= 1
    assert result.allocation_rate <= 1.0


def test_fifo_orders_by_arrival_priority_by_class():
    # One GPU, busy; a batch pod then a high pod wait; fifo starts the batch pod first.
    nodes = [("n0", 8000, 16384, ["T4"])]
    trace = [
        pr.Arrival(0.0, ONE_GPU, False, 100.0),
        pr.Arrival(10.0, ONE_GPU, False, 100.0),
        pr.Arrival(20.0, ONE_GPU, True, 100.0),
    ]
    fifo = pr.replay(nodes, trace, "fifo", CONFIG, horizon=1000.0)
    prio = pr.replay(nodes, trace, "priority", CONFIG, horizon=1000.0)
    assert fifo.high_wait_p99 == pytest.approx(180.0)  # starts at 200
    assert prio.high_wait_p99 == pytest.approx(80.0)  # starts at 100


def test_the_stream_is_calibrated_to_the_load():
    pods = [
        pr.TracePod(ONE_GPU, i % 2 == 0, float(i * 100), float(300 + 50 * i)) for i in range(20)
    ]
    stream, cycle = pr.build_stream(pods, 1.3, capacity_gpus=4, horizon=3600.0)
    pattern = pr._pattern(pods)
    assert pr.offered_load(pods, pattern, cycle, 3600.0, 4) == pytest.approx(1.3, rel=1e-3)
    assert all(a.time < 3600 for a in stream)
    assert [a.time for a in stream] == sorted(a.time for a in stream)


@pytest.mark.skipif(
    not (TRACES / "openb_node_list_gpu_node.csv").exists(),
    reason=f"Alibaba trace not found at {TRACES} (set GPULAB_TRACES)",
)
def test_cli_prints_every_row_and_the_goals():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--traces", str(TRACES), "--loads", "1.3"]
        + ["--limit", "300", "--placement", "best-fit"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith(" 1.3 ")]
    assert [row.split()[1] for row in rows] == list(pr.SCHEMES)
    assert "gpulab goodput / priority goodput" in out and "(goal <= 0.5)" in out
