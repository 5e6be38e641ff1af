"""What the spawner puts in a server's environment for a slice.

The GPU itself cannot run here, so these check the environment that holds a
process to its slice on a real GPU (CUDA reads it at start), and that nothing
from outside can widen it.
"""

import os
import pwd

import pytest

from gpulab.enforcement.slice_env import (
    NO_MPS_DIR,
    mps_pipe_directory,
    slice_env,
    strip_enforcement_vars,
)
from gpulab.spawner.local import parse_user_options

QUARTER = [{"gpu_uuid": "GPU-1111", "milli": 250, "memory_mib": 20480}]


def test_quarter_on_a_real_gpu_without_mps():
    env = slice_env(QUARTER, simulated=False, mps_dir=None)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1111"
    assert env["GPULAB_GPU_MILLI"] == "250"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.250"
    # CUDA looks for no daemon in /tmp, where another account could have started one.
    assert {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")} == {
        "CUDA_MPS_PIPE_DIRECTORY": NO_MPS_DIR
    }


def test_quarter_with_an_mps_daemon(tmp_path):
    os.mkfifo(tmp_path / "control")  # what nvidia-cuda-mps-control creates
    mps = mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert mps == str(tmp_path)
    env = slice_env(QUARTER, simulated=False, mps_dir=mps)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")}) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the folder to another account")
def test_a_daemon_folder_another_account_made_is_not_used(tmp_path):
    """bob makes the default pipe folder first and starts his own daemon there: neither
    his folder nor his pipe in root's folder, nor a link to either, is used."""
    nobody = pwd.getpwnam("nobody").pw_uid
    planted = tmp_path / "planted"
    planted.mkdir()
    os.mkfifo(planted / "control")
    os.chown(planted / "control", nobody, -1)
    os.chown(planted, nobody, -1)
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(planted)}) is None
    os.chown(planted, 0, -1)  # root's folder, his pipe in it
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(planted)}) is None
    os.chown(planted / "control", 0, -1)
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(planted)}) == str(planted)
    (tmp_path / "link").symlink_to(planted)
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "link")}) is None


def test_whole_gpus_get_no_fraction_and_simulated_enforces_nothing():
    two = [
        {"gpu_uuid": "GPU-a", "milli": 1000, "memory_mib": 81920},
        {"gpu_uuid": "GPU-b", "milli": 1000, "memory_mib": 81920},
    ]
    env = slice_env(two, simulated=False, mps_dir=None)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and env["GPULAB_GPU_MILLI"] == "2000"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    sim = slice_env(QUARTER, simulated=True, mps_dir="/tmp/x")
    assert sim["GPULAB_GPU_SIMULATED"] == "1" and "PYTORCH_CUDA_ALLOC_CONF" not in sim
    assert slice_env([], simulated=False, mps_dir=None)["CUDA_VISIBLE_DEVICES"] == ""


def test_user_set_enforcement_variables_are_stripped():
    env = {
        "PATH": "/bin",
        "LD_PRELOAD": "/evil.so",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "CUDA_DISABLE_CONTROL": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "GPULAB_GPU_MILLI": "8000",
        "GPULAB_CACHE_DIR": "/cache",
    }
    assert strip_enforcement_vars(env) == {"PATH": "/bin", "GPULAB_CACHE_DIR": "/cache"}


def test_parse_user_options():
    assert parse_user_options({}) == 0 and parse_user_options({"gpu_milli": "250"}) == 250
    for bad in ([1], {"gpu_milli": 250, "env": {}}, {"gpu_milli": 2500}):
        try:
            parse_user_options(bad)
        except Exception as e:
            assert e.status_code == 400 and "invalid user_options" in e.log_message
        else:
            raise AssertionError(f"{bad!r} accepted")
