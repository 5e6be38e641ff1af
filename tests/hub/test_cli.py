import subprocess
import sys
from pathlib import Path

GPULAB = str(Path(sys.executable).with_name("gpulab"))


def test_bad_gpu_spec_says_how_to_write_it(tmp_path):
    r = subprocess.run(
        [GPULAB, "up", "--data-dir", str(tmp_path), "--simulate-gpus", "2A100"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "write COUNTxMODEL-MEMGB" in r.stderr


def test_help_all_lists_settings_with_examples():
    r = subprocess.run([GPULAB, "up", "--help-all"], capture_output=True, text=True, check=True)
    assert "c.GpuLabService.default_user_quota_milli = 1000" in r.stdout
    assert "c.FractionalLocalSpawner.gpulab_api_url" in r.stdout


def test_agent_and_service_take_their_own_options():
    r = subprocess.run([GPULAB, "agent", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--service-url" in r.stdout
