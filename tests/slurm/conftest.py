"""A 2-node Slurm sandbox shared by the module's tests, and the in-process service on it.

The sandbox's data dir and the service's data dir live under ``/var/tmp`` (mode
0755 all the way), not pytest's ``tmp_path`` (``/tmp/pytest-of-root`` is 0700):
the jobs run as the owners' Unix accounts, which must reach the munge socket,
``slurm.conf`` and their job dirs.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpulab.backend import slurm_sandbox


@pytest.fixture(scope="module")
def slurm_base():
    base = Path(tempfile.mkdtemp(prefix="gpulab-slurm-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def sandbox(slurm_base):
    """Two nodes with 2 simulated GPUs (20 shards each); stopped and removed after."""
    data = slurm_base / "sandbox"
    state = slurm_sandbox.start(data, nodes=2, gpus_spec="gpu:2,shard:40")
    try:
        yield state
    finally:
        slurm_sandbox.stop(data)
