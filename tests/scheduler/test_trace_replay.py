"""The trace replay: loading, inflation, metrics, and a smoke run on the real trace."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.scheduler.policy import Request
from gpulab.scheduler.trace import gpu_capacity, inflate, load_nodes, load_tasks, replay

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(
    os.environ.get("GPULAB_TRACES", REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023")
)
needs_trace = pytest.mark.skipif(
    not (TRACES / "openb_node_list_gpu_node.csv").exists(),
    reason=f"Alibaba trace not found at {TRACES} (set GPULAB_TRACES)",
)


def write(path, text):
    path.write_text(text.strip() + "\n")
    return path


def test_loading_csvs(tmp_path):
    nodes = load_nodes(
        write(
            tmp_path / "n.csv",
            """
sn,cpu_milli,memory_mib,gpu,model
a,64000,262144,2,P100
b,32000,131072,0,
""",
        )
    )
    assert nodes == [("a", 64000, 262144, ["P100", "P100"]), ("b", 32000, 131072, [])]
    tasks = load_tasks(
        write(
            tmp_path / "p.csv",
            """
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,12000,16384,1,460,
p1,4000,8192,0,0,
p2,8000,8192,2,1000,V100M16|V100M32
""",
        )
    )
    assert tasks[0] == Request(gpu_milli=460, num_gpu=1, cpu_milli=12000, memory_mib=16384)
    assert tasks[1].num_gpu == 0 and tasks[1].gpu_models is None
    assert (
        tasks[2].gpu_models == frozenset({"V100M16", "V100M32"})
        and tasks[2].total_gpu_milli == 2000
    )


def test_inflation_shuffles_then_tops_up_to_the_ratio():
    trace = [Request(gpu_milli=m, num_gpu=1) for m in (100, 200, 300, 1000)] + [
        Request(cpu_milli=1)
    ]
    capacity = 4000
    tasks = inflate(trace, capacity, 1.3, seed=42)
    assert sorted(map(id, tasks[:5])) == sorted(map(id, trace))  # the whole trace, reordered
    asked = sum(t.total_gpu_milli for t in tasks)
    assert asked <= 1.3 * capacity and len(tasks) > len(trace)
    assert inflate(trace, capacity, 1.3, seed=42) == tasks
    assert inflate(trace, capacity, 1.3, seed=43) != tasks


def test_replay_reports_levels_and_failures():
    # Two 1-GPU nodes and a trace of 0.7 slices: after two tasks nothing else
    # fits, so from 70% arrived on, 60% of the GPU stays unallocated.
    nodes = [("a", 8000, 8192, ["T4"]), ("b", 8000, 8192, ["T4"])]
    trace = [Request(gpu_milli=700, num_gpu=1, cpu_milli=1000, memory_mib=1024)] * 4
    result = replay(nodes, trace, "best-fit", seed=1, ratio=1.3, levels=(35, 70, 105))
    assert result.unallocated_pct == {
        35: pytest.approx(65.0),
        70: pytest.approx(30.0),
        105: pytest.approx(30.0),
    }
    assert result.fragmented_pct[70] == pytest.approx(30.0)  # two 0.3 holes no 0.7 task can use
    assert result.failed_tasks == result.tasks - 2
    assert len(result.decision_ms) == len(result.decision_cpu_ms) == result.tasks


@needs_trace
def test_replay_smoke_on_the_real_trace():
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    trace = load_tasks(TRACES / "openb_pod_list_default.csv")
    assert len(nodes) == 1213 and gpu_capacity(nodes) == 6212 * 1000
    for policy in ("fgd", "gpulab"):
        result = replay(nodes, trace, policy, seed=42, limit=300)
        assert result.tasks == 300 and result.failed_tasks == 0


@needs_trace
def test_benchmark_cli_prints_json():
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "trace_replay.py"),
            "--nodes",
            str(TRACES / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(TRACES / "openb_pod_list_gpuspec20.csv"),
            "--policy",
            "gpulab",
            "--seeds",
            "42",
            "--limit",
            "200",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    summary = json.loads(out)
    assert summary["policy"] == "gpulab" and summary["failed_tasks"] == 0
    assert set(summary["decision_ms"]) == {"p50", "p99"}
    assert summary["unallocated_pct"] == {}  # 200 tasks reach no reported level
