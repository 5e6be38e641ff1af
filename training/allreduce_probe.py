"""A short all-reduce probe, run by every rank under torchrun (``%gpulab nettest``).

It measures what nccl-tests' ``all_reduce_perf`` measures, with its definitions:

- ``time_s``: seconds per all-reduce, the slowest rank's average over ``iters``
  timed calls after ``warmup`` untimed ones;
- ``algbw = size_bytes / time_s``;
- ``busbw = algbw * 2 * (n - 1) / n`` for ``n`` ranks: the bytes each link
  carries in a ring all-reduce, so the number compares with the hardware's
  link speed whatever ``n`` is.

One node, N processes::

    torchrun --standalone --nproc-per-node 4 -m gpulab.training.allreduce_probe --size 64M

Several nodes (run the same line on each node; ``--node-rank`` 0 on the one whose
address is the endpoint; in network namespaces add ``--local-addr <ip>`` and set
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``)::

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 \\
        --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id nettest \\
        -m gpulab.training.allreduce_probe --size 256M --json-out /tmp/nettest.json

Rank 0 prints one line ``GPULAB_ALLREDUCE <json>`` per size and writes the list
to ``--json-out``. Inside a process group that is already up (a gpulab job's
ranks after ``setup()``: ``%gpulab nettest --nodes N`` submits such a job),
every rank calls ``run_probe(size, iters, warmup)`` instead. The backend is
NCCL on CUDA, gloo otherwise. Only torch and the standard library are used
here: this runs inside training ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from .sizes import parse_size as parse_bytes

RESULT_PREFIX = "GPULAB_ALLREDUCE "


def parse_size(text: str | int) -> int:
    """Bytes per all-reduce (a multiple of 4: float32s) from ``65536``, ``64K``, ``16M``...

    Sizes follow gpulab's one rule (:mod:`gpulab.training.sizes`): ``K``/``M``/``G``
    alone and ``KiB``/``MiB``/``GiB`` are powers of 1024, ``KB``/``MB``/``GB`` of 1000.
    """
    size = parse_bytes(text)
    if size < 4:
        raise ValueError(f"size {text!r}: at least 4 bytes (one float32)")
    return size - size % 4


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n (0 for one rank: nothing crosses a link)."""
    return 2.0 * (world_size - 1) / world_size


def bandwidths(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second for one all-reduce of ``size_bytes``."""
    algbw = size_bytes / time_s
    return algbw, algbw * bus_factor(world_size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(size_bytes: int, iters: int, warmup: int, device: torch.device) -> dict:
    """Time ``iters`` all-reduces of ``size_bytes`` in the current process group."""
    world = dist.get_world_size()
    buf = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(device)
    elapsed = time.perf_counter() - start
    # The collective is as slow as its slowest rank (nccl-tests reports the same).
    slowest = torch.tensor([elapsed / iters], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    time_s = float(slowest.item())
    # A wrong sum would make any bandwidth meaningless: check one reduction.
    buf.fill_(float(dist.get_rank() + 1))
    dist.all_reduce(buf)
    expected = world * (world + 1) / 2
    if not torch.allclose(buf[:16], torch.full_like(buf[:16], expected)):
        raise RuntimeError(f"all-reduce returned {buf[:4].tolist()}, expected {expected}")
    algbw, busbw = bandwidths(size_bytes, time_s, world)
    return {
        "size_bytes": size_bytes,
        "iters": iters,
        "warmup": warmup,
        "time_s": time_s,
        "algbw_bytes_per_second": algbw,
        "busbw_bytes_per_second": busbw,
        "world_size": world,
        "backend": str(dist.get_backend()),
    }


def _nodes() -> list[str]:
    """The nodes of the ranks, in rank order: host names, deduplicated.

    Agents that share a host name (a job's nodes started on one machine, network
    namespaces) are told apart by torchrun's ``GROUP_RANK``: ``host/node1``.
    """
    me = (socket.gethostname(), int(os.environ.get("GROUP_RANK", "0")))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    agents = list(dict.fromkeys(tuple(a) for a in everyone))
    hosts = list(dict.fromkeys(host for host, _ in agents))
    if len(hosts) == len(agents):
        return hosts
    return [f"{host}/node{group}" for host, group in agents]


def _group_device() -> torch.device:
    # An initialised group's tensors live where its backend wants them.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def probe(sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """Probe each size in this process's group, every rank calling it; one dict per size.

    Inside a ``%%train_distributed`` job (after ``setup()``) it uses the job's
    group; without one it joins a group from torchrun's environment (NCCL on
    CUDA, gloo otherwise) and leaves it at the end.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got {iters} and {warmup}")
    own = not dist.is_initialized()
    if own:
        cuda = torch.cuda.is_available()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
    else:
        device = _group_device()
    try:
        nodes = _nodes()
        results = [{**measure(s, iters, warmup, device), "nodes": nodes} for s in sizes]
        dist.barrier()
        return results
    finally:
        if own:
            dist.destroy_process_group()


def run_probe(
    size: int | str = "16M", iters: int = 20, warmup: int = 5, record: bool = False
) -> dict:
    """One size (bytes, or ``64K``/``16M``/``1G``) from inside a rank: ``%gpulab nettest --nodes``.

    Every rank of the group must call it; each gets the same result (the
    slowest rank's time)::

        from gpulab.training import setup
        from gpulab.training.allreduce_probe import run_probe
        setup()
        result = run_probe("16M", iters=20, record=True)

    With ``record`` (in a gpulab job), rank 0 writes the result as JSON to the job's
    ``out/`` dir; the service records it for the dashboard when the job succeeds.
    """
    result = probe([parse_size(size)], iters, warmup)[0]
    if record:
        write_job_result(result)
    return result


def write_job_result(result: dict) -> str | None:
    """Rank 0 of a gpulab job: write ``result`` where the service reads it; the path."""
    from gpulab.training import env as rank_env

    job_dir = os.environ.get(rank_env.JOB_DIR)
    if not job_dir or int(os.environ.get("RANK", "0")) != 0:
        return None
    out = os.path.join(job_dir, "out")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, rank_env.ALLREDUCE_RESULT)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return path


def run(sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """The CLI's probe: every size, joining (and leaving) a group from torchrun's env."""
    return probe(sizes, iters, warmup)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpulab.training.allreduce_probe",
        description="All-reduce bus bandwidth probe (nccl-tests definitions); run it "
        "under torchrun.",
    )
    p.add_argument(
        "--size",
        default="16M",
        help="bytes per all-reduce, comma-separated for several (e.g. 1M,16M,64M; default 16M)",
    )
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces first")
    p.add_argument("--json-out", help="rank 0 writes the results (a JSON list) here")
    args = p.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in str(args.size).split(",") if s.strip()]
    except ValueError as e:
        p.error(str(e))
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error(
            "run me under torchrun, e.g. torchrun --standalone --nproc-per-node 2 "
            "-m gpulab.training.allreduce_probe"
        )
    results = run(sizes, args.iters, args.warmup)
    if int(os.environ["RANK"]) == 0:
        for r in results:
            print(RESULT_PREFIX + json.dumps(r), flush=True)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
