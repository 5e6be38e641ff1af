"""The variables a gpulab backend sets for its ranks (one place, read by all)."""

from __future__ import annotations

import os

JOB_DIR = "GPULAB_JOB_DIR"
JOB_ID = "GPULAB_JOB_ID"
CHECKPOINT_DIR = "GPULAB_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "GPULAB_CHECKPOINT_EVERY"
AMP = "GPULAB_AMP"
COMM_HOOK = "GPULAB_COMM_HOOK"
OUT = "GPULAB_OUT"
#: "1": ``ctx.wrap(model)`` shards with FSDP2 (``--fsdp``), as ``shard=True`` does.
FSDP = "GPULAB_FSDP"
#: A QAT scheme (``--qat int8-int4``): ``ctx.wrap(model)`` trains quantization-aware,
#: as ``qat=`` does.
QAT = "GPULAB_QAT"
#: Comma-separated device per local rank on this node (GPU UUIDs); empty on CPU.
NODE_GPUS = "GPULAB_NODE_GPUS"
#: The memory cap of this node's group (its ranks and their agent), in bytes, where
#: the backend holds one: a rank cannot read its own cgroup's limit (0700).
NODE_MEMORY_BYTES = "GPULAB_NODE_MEMORY_BYTES"
#: Share of its GPU each rank may use, in milli-GPU (1000 = whole card).
GPU_MILLI = "GPULAB_GPU_MILLI"
#: The job's rendezvous secret itself (Kubernetes: from the job's Secret), or
#: the file that holds it (local and Slurm: ``<job dir>/rdzv.secret``, the owner's
#: only); see :mod:`gpulab.training.rendezvous`.
RDZV_SECRET = "GPULAB_RDZV_SECRET"
RDZV_SECRET_FILE = "GPULAB_RDZV_SECRET_FILE"

#: The all-reduce probe's result, in the job's ``out/`` dir (rank 0 writes it; the
#: service reads it when the job succeeds and shows it on the Network tab).
ALLREDUCE_RESULT = "allreduce.json"


def get(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
