"""An out-of-memory rank says what it held against the slice's cap and what to change."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from localrun import new_spec, run  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402
from gpulab.training import memory  # noqa: E402

TOO_BIG = """
from gpulab.training import setup
ctx = setup()
if ctx.rank == 1:
    weights = bytearray(1 << 50)  # a petabyte: no slice holds it
ctx.barrier()
"""


@pytest.mark.slow
def test_a_rank_out_of_memory_names_its_size_the_cap_and_the_fixes(tmp_path):
    backend = LocalBackend(str(tmp_path / "jobs"))
    status, jd = run(backend, new_spec(TOO_BIG, nproc_per_node=2))
    assert status.state == "failed", status
    assert status.error["rank"] == 1 and status.error["type"] == "MemoryError"
    line = status.error["message"]
    assert line.startswith("rank 1 ran out of memory: it held up to "), line
    assert "GiB" in line and "\n" not in line
    assert "ctx.wrap(model, shard=True) (or --fsdp)" in line
    assert "a bigger slice (--gpu)" in line and "LoRA" in line
    assert line in status.message


def test_what_counts_as_out_of_memory():
    import torch

    assert memory.is_out_of_memory(MemoryError())
    assert memory.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to"))
    assert not memory.is_out_of_memory(ValueError("bad shape"))


def test_the_cap_is_the_memory_cgroup_of_the_process(tmp_path):
    limit, peak = memory.cgroup_memory()
    with open("/proc/self/cgroup") as f:
        memory_line = [ln for ln in f if ln.split(":")[1] in ("memory", "")]
    assert memory_line  # v1 or v2: one of them says where this process is held
    assert limit is None or limit > 0
    assert peak is None or peak > 0
    assert memory.cgroup_memory("no-such-pid") == (None, None)
