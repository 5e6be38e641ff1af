"""The command line and environment of one node of a job: pure functions.

Every backend renders the same thing: torchrun (``python -m
gpulab.training.launch``) with gpulab's signed c10d rendezvous
(``--rdzv-backend=gpulab``, :mod:`gpulab.training.rendezvous`: a state not
signed with the job's secret, ``<job_dir>/rdzv.secret``, is never unpickled),
started once per node, running ``python -m gpulab.training.runner <job_dir>``
in each of its processes. The ``PET_*`` variables say the same as the flags, so a
Kubeflow runtime (which sets ``PET_NNODES``, ``PET_NODE_RANK``...) and torchrun
agree. Across hosts (network namespaces, pods) torchrun needs the node's own
address (``--local-addr``), to be told which node hosts the rendezvous store
(``is_host``) and which interface gloo uses; restarts after a worker dies need
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (pytorch#135712).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gpulab.training import env as rank_env

from .jobdir import RDZV_SECRET
from .spec import JobSpec

#: torchrun's name of gpulab's rendezvous (:data:`gpulab.training.rendezvous.NAME`).
RDZV_BACKEND = "gpulab"


@dataclass(frozen=True)
class NodeLaunch:
    node_rank: int
    argv: list[str]
    env: dict[str, str]


def torchrun_argv(python: str = sys.executable) -> list[str]:
    # The module form runs the torchrun of the interpreter that has gpulab installed;
    # gpulab's launcher is torchrun with ``--rdzv-backend=gpulab`` registered.
    return [python, "-m", "gpulab.training.launch"]


def render_node(
    spec: JobSpec,
    node_rank: int,
    *,
    job_dir: str,
    rdzv_host: str,
    rdzv_port: int,
    local_addr: str | None = None,
    ifname: str | None = None,
    node_gpus: list[str] | None = None,
    launcher: list[str] | None = None,
) -> NodeLaunch:
    """torchrun's argv and the variables (beyond the inherited environment) for one node.

    ``node_gpus`` are the device UUIDs of this node's ranks, in local-rank order
    (empty on CPU or simulated GPUs). ``launcher`` replaces ``python -m
    gpulab.training.launch`` (it must register the ``gpulab`` rendezvous too).
    """
    if not 0 <= node_rank < spec.nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.nodes - 1}")
    endpoint = f"{rdzv_host}:{rdzv_port}"
    is_host = 1 if node_rank == 0 else 0
    argv = [
        *(launcher or torchrun_argv()),
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.nproc_per_node}",
        f"--rdzv-backend={RDZV_BACKEND}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={spec.id or spec.name}",
        f"--rdzv-conf=is_host={is_host},timeout=120",
        # An elastic job's failures are the service's: it goes on with fewer nodes.
        f"--max-restarts={0 if spec.elastic else spec.max_restarts}",
        "--monitor-interval=0.5",
        f"--log-dir={job_dir}/torchrun/node{node_rank}",
    ]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    argv += ["--module", "gpulab.training.runner", job_dir]
    env = {
        "PET_NNODES": str(spec.nodes),
        "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
        "PET_NODE_RANK": str(node_rank),
        "PET_RDZV_BACKEND": RDZV_BACKEND,
        "PET_RDZV_ENDPOINT": endpoint,
        "PET_RDZV_ID": spec.id or spec.name,
        "PET_MAX_RESTARTS": str(0 if spec.elastic else spec.max_restarts),
        "PET_MASTER_ADDR": rdzv_host,
        "PET_MASTER_PORT": str(rdzv_port),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # One thread per rank unless the user says otherwise: ranks share cores.
        "OMP_NUM_THREADS": spec.env.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        rank_env.JOB_ID: spec.id,
        rank_env.JOB_DIR: job_dir,
        rank_env.CHECKPOINT_DIR: spec.checkpoint_dir or f"{job_dir}/checkpoints",
        rank_env.CHECKPOINT_EVERY: str(spec.checkpoint_every),
        rank_env.AMP: spec.amp,
        rank_env.COMM_HOOK: spec.comm_hook,
        rank_env.OUT: spec.out,
        rank_env.NODE_GPUS: ",".join(node_gpus or []),
        rank_env.GPU_MILLI: str(spec.gpu_milli),
        # The path, never the secret (every account sees a command line); the
        # file is the owner's only. Kubernetes gives the secret itself instead.
        rank_env.RDZV_SECRET_FILE: f"{job_dir}/{RDZV_SECRET}",
    }
    if spec.fsdp:
        # Only when asked: a job without --fsdp renders as it did before the flag.
        env[rank_env.FSDP] = "1"
    if spec.qat:  # the same: only when asked
        env[rank_env.QAT] = spec.qat
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
        env["NCCL_SOCKET_IFNAME"] = ifname
    env.update(spec.env)
    return NodeLaunch(node_rank, argv, env)
