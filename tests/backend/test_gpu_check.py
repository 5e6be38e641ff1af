"""`make gpu-check` (benchmarks/gpu_check.py) here, on a machine without a GPU.

Without a driver it must print its table with every row skipped, quickly, and
exit 0. The machinery its GPU checks use (torchrun, the quantizer, a replica
started in a cgroup as the local serving backend starts one) is run on CPU by
``--plumbing``.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def _has_driver() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia")


def test_without_a_driver_every_row_is_skipped_at_once():
    if _has_driver():
        pytest.skip("an NVIDIA driver is here: run `make gpu-check` for the real checks")
    started = time.monotonic()
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    lines = done.stdout.strip().splitlines()
    assert lines[:2] == ["| check | result | figure | note |", "|---|---|---|---|"]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    assert [r[0] for r in rows] == [
        "NVML inventory vs nvidia-smi",
        "memory caps: a 1/4 slice asks for 1/2 of the card",
        "device cgroup hides other cards",
        "device cgroup: a group without GPU opens no card",
        "NCCL all_reduce, 2 ranks (torchrun)",
        "quantize fp8-dynamic",
        "quantize fp8-weight",
        "replica on a 1/4 slice (OIP v2 infer)",
        "OpenAI gateway vs vllm serve alone, 16 streams",
    ]
    assert {r[1] for r in rows} == {"skipped: no NVIDIA driver"}
    assert all("NVML" in r[3] for r in rows)


def test_unknown_checks_are_refused_with_the_choices():
    done = subprocess.run(
        [sys.executable, SCRIPT, "--only", "inventory,warp"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown checks ['warp']; choose from inventory,memory" in done.stderr.replace(", ", ",")


def test_nvidia_smi_rows_and_the_table_are_read_and_written_as_markdown():
    check = _load()
    smi = "GPU-8f2c, NVIDIA H200, 143771\nGPU-1a2b, NVIDIA H100 80GB HBM3, 81559\n"
    assert check.parse_smi_csv(smi) == [
        ("GPU-8f2c", "NVIDIA H200", 143771),
        ("GPU-1a2b", "NVIDIA H100 80GB HBM3", 81559),
    ]
    rows = [check.Row("a", "pass", "1 ms", ""), check.Row("b", "n/a: one GPU")]
    assert check.table(rows) == (
        "| check | result | figure | note |\n|---|---|---|---|\n"
        "| a | pass | 1 ms |  |\n| b | n/a: one GPU |  |  |"
    )


@pytest.mark.slow
def test_the_checks_machinery_runs_on_cpu():
    done = subprocess.run(
        [sys.executable, SCRIPT, "--plumbing", "--deadline", "240"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        r[0]: r[1:]
        for r in (
            [c.strip() for c in ln.strip("|").split("|")]
            for ln in done.stdout.strip().splitlines()[2:]
        )
    }
    assert rows["gloo all_reduce, 2 ranks (torchrun)"][0] == "pass"
    assert rows["quantize int8-dynamic (MLP 1024-4096-1024)"][0] == "pass"
    replica = rows["replica on a 1/4 slice (OIP v2 infer)"]
    assert replica[0] == "pass", replica
    if os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup/cpu"):
        # The replica ran in a group of its own, as the serving backend will start it.
        assert replica[2].startswith("cgroup v1: 1 CPU, 8 GiB"), replica
