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


def test_on_cpu_the_cap_is_the_ranks_share_of_its_nodes_group(monkeypatch):
    # The backend says the node group's cap: the rank cannot read its cgroup (0700).
    monkeypatch.setenv("GPULAB_NODE_MEMORY_BYTES", str(3 * 2**30))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert memory.cpu_cap() == (3 * 2**29, "its share of the slice's cap (3.00 GiB for 2 ranks)")
    line = memory.explain(MemoryError(), 1)
    assert "against its share of the slice's cap (3.00 GiB for 2 ranks), 1.50 GiB; " in line
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert memory.cpu_cap() == (3 * 2**30, "the slice's cap")


OVER_THE_CAP = """
import torch
from gpulab.training import setup
ctx = setup()
weights = torch.ones(2**29)  # 2 GiB, touched: over the slice's 1 GiB
ctx.barrier()
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="accounts and cgroups need root (CI runs as root)")
def test_a_rank_the_kernel_killed_for_memory_is_named_with_the_cap(tmp_path):
    """The cgroup's OOM killer stops a rank with SIGKILL: it cannot speak, so the
    backend reads the node group's OOM kills and says it instead of "Signal 9"."""
    import subprocess
    import uuid

    from hubproc import fresh_user, let_accounts_reach

    from gpulab.enforcement.account_limits import AccountLimits
    from gpulab.enforcement.accounts import UserAccounts

    let_accounts_reach(tmp_path)
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    user = fresh_user(f"oom{uuid.uuid4().hex[:4]}")
    (tmp_path / "jobs").mkdir()
    limits = AccountLimits(memory_per_gpu=64 * 2**30, memory_floor=2**30)
    backend = LocalBackend(str(tmp_path / "jobs"), accounts=accounts, limits=limits)
    try:
        status, jd = run(backend, new_spec(OVER_THE_CAP, user=user))
    finally:
        subprocess.run(["userdel", accounts.name_for(user)], capture_output=True)
    assert status.state == "failed", status
    assert status.message.startswith(
        "rank 0 was killed for memory: node 0's ranks needed more than the slice's cap of "
        "1.00 GiB; shard the model with ctx.wrap(model, shard=True) (or --fsdp)"
    ), status
    assert status.error["message"] == status.message
