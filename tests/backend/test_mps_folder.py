"""On a real GPU a job's ranks reach an MPS daemon only where the host trusts one.

CUDA looks for the daemon in ``/tmp/nvidia-mps`` unless told otherwise, a folder any
account can make and start a daemon in. No GPU here: the backend is told its GPUs are
real, and the rank shows where its CUDA would look.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from localrun import new_spec, run  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402
from gpulab.enforcement.slice_env import NO_MPS_DIR, mps_pipe_directory  # noqa: E402


def test_ranks_on_a_real_gpu_look_for_no_daemon_in_tmp(tmp_path):
    assert mps_pipe_directory() is None  # this host runs no daemon of root's
    backend = LocalBackend(str(tmp_path / "jobs"), real_gpus=True)
    code = "import os; print('MPS', os.environ.get('CUDA_MPS_PIPE_DIRECTORY'))"
    status, jd = run(backend, new_spec(code))
    log = open(jd.p("logs", "rank0.log")).read()
    assert status.state == "succeeded", (status, log)
    assert f"MPS {NO_MPS_DIR}\n" in log, log
