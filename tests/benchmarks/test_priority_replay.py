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


EIGHT_GPUS = Request(gpu_milli=1000, num_gpu=8, cpu_milli=8000, memory_mib=8192)
BIG_NODE = [("n0", 64000, 65536, ["T4"] * 8)]


def elastic_trace():
    """An 8-GPU batch job fills the node; a 1-GPU high pod comes at t=1000 for 500 s.

    gpulab stops the job (it waits for the high pod to leave, then reruns at 8);
    gpulab-elastic shrinks it to 7 and grows it back to 8 when the high pod leaves.
    """
    return [
        pr.Arrival(0.0, EIGHT_GPUS, False, 3000.0),  # 3000 s at 8 GPUs = 24000 GPU-s
        pr.Arrival(1000.0, ONE_GPU, True, 500.0),
    ]


def run_elastic(scheme, trace=None):
    return pr.replay(BIG_NODE, trace or elastic_trace(), scheme, CONFIG, horizon=10_000.0)


def test_only_batch_pods_of_several_whole_gpus_are_elastic():
    assert pr.is_elastic(EIGHT_GPUS, high=False)
    assert not pr.is_elastic(EIGHT_GPUS, high=True)  # high pods are never made room from
    assert not pr.is_elastic(ONE_GPU, high=False)
    assert not pr.is_elastic(Request(gpu_milli=500, num_gpu=2), high=False)  # shared GPUs
    half = pr.width_request(EIGHT_GPUS, 4)
    assert (half.num_gpu, half.cpu_milli, half.memory_mib) == (4, 4000, 4096)


def test_an_elastic_job_shrinks_instead_of_being_stopped():
    stopped, elastic = run_elastic("gpulab"), run_elastic("gpulab-elastic")
    # gpulab stops the job; gpulab-elastic only shrinks it: nothing goes back to the queue
    assert stopped.preemptions == 1 and stopped.shrinks == 0
    assert elastic.preemptions == 0 and elastic.shrinks == 1 and elastic.grows == 1
    # the high pod waits as long as for a victim: the step in flight + the save
    assert elastic.high_wait_p99 == pytest.approx(15.0) == stopped.high_wait_p99
    # the same work is done, and done sooner: the job never waits in the queue
    assert elastic.batch_finished == stopped.batch_finished == 1
    assert elastic.batch_goodput_gpu_h == stopped.batch_goodput_gpu_h == pytest.approx(24000 / 3600)
    # gpulab: rerun at 8 GPUs once the high pod leaves at 1515: 2000 s left -> 3515.
    assert stopped.batch_completion_mean_h == pytest.approx(3515 / 3600)
    # elastic: 7 GPUs from 1025 (save + restart), grown to 8 at 1515 (restart at 1540)
    # with 2000 - 490 * 7/8 s left at full size.
    assert elastic.batch_completion_mean_h == pytest.approx((1540 + 2000 - 490 * 7 / 8) / 3600)
    # lost: the stop (8 GPUs x 15 s), the restart at 7 (7 x 10 s), the growth (8 x 25 s)
    assert elastic.lost_gpu_h == pytest.approx((8 * 15 + 7 * 10 + 8 * 25) / 3600)


def test_an_elastic_job_starts_smaller_and_grows_when_room_frees():
    trace = [
        pr.Arrival(0.0, Request(1000, 6, 6000, 6144), False, 1000.0),  # fixed: 6 GPUs
        pr.Arrival(10.0, EIGHT_GPUS, False, 1000.0),
    ]
    fixed, elastic = run_elastic("gpulab", trace), run_elastic("gpulab-elastic", trace)
    assert fixed.batch_finished == elastic.batch_finished == 2
    # fixed: it waits for all 8 GPUs (t=1000) and ends at 2000
    assert fixed.batch_completion_mean_h == pytest.approx((1000 + 1990) / 2 / 3600)
    # elastic: 2 GPUs from t=10 (1/4 speed: 247.5 s of work by t=1000), then 8
    assert elastic.grows == 1 and elastic.preemptions == elastic.shrinks == 0
    # grown at 1000 (step boundary + save + restart: runs at 8 from 1025): ends at 1777.5
    assert elastic.batch_completion_mean_h == pytest.approx((1000 + 1767.5) / 2 / 3600)
    assert elastic.batch_completion_mean_h < fixed.batch_completion_mean_h


def test_a_job_is_stopped_when_shrinking_cannot_make_room():
    # The high pod needs all 8 GPUs: no shrink (MIN is 1) makes room, so the job stops.
    trace = [
        pr.Arrival(0.0, EIGHT_GPUS, False, 3000.0),
        pr.Arrival(1000.0, EIGHT_GPUS, True, 100.0),
    ]
    result = run_elastic("gpulab-elastic", trace)
    assert result.preemptions == 1 and result.shrinks == 0
    assert result.high_wait_p99 == pytest.approx(15.0)


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
    assert "gpulab-elastic goodput / priority goodput" in out
    assert "gpulab-elastic high wait p99" in out and "23 of the trace's" in out
