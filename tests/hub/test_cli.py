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
    assert "c.SharingSettings.default_user_quota_milli = 1000" in r.stdout
    assert "c.FractionalLocalSpawner.gpulab_api_url" in r.stdout


def test_agent_and_service_take_their_own_options():
    r = subprocess.run([GPULAB, "agent", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--service-url" in r.stdout


def banner(tmp_path, *args) -> str:
    """What `gpulab up` prints before it starts the hub (`-- --version`: the hub prints
    its version and exits)."""
    r = subprocess.run(
        [GPULAB, "up", "--data-dir", str(tmp_path), *args, "--", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_banner_says_when_there_are_no_gpus_and_how_to_simulate_some(tmp_path):
    from gpulab.hub_ext.gpu_banner import driver_gpus, gpus_line

    said = banner(tmp_path)
    if driver_gpus()[0] == 0:  # this machine: no NVIDIA driver
        assert "GPUs: none on this machine (no NVIDIA driver found)" in said, said
        assert "start it with --simulate-gpus SPEC" in said, said
        assert "from the NVIDIA driver" not in said, said
    else:
        assert "from the NVIDIA driver" in said, said
    assert "from the NVIDIA driver" in gpus_line("", probe=lambda: (2, ""))
    loaded = gpus_line("", probe=lambda: (0, "the NVIDIA driver is not loaded"))
    assert loaded.startswith("none on this machine (the NVIDIA driver is not loaded)")
    # `make up` without nvidia-smi passes --simulate-gpus: the banner says they are declared.
    said = banner(tmp_path, "--simulate-gpus", "2xA100-80GB")
    assert "GPUs: simulated 2xA100-80GB (declared by --simulate-gpus" in said, said
