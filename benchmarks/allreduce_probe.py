"""All-reduce bus bandwidth: gpulab's probe vs a plain ``torch.distributed.all_reduce`` loop.

Both run under real torchrun with the same ranks, sizes and iteration counts,
in the same run, alternating which goes first; each size's busbw is the median
over ``--repeats`` launches. The anchor is the loop anyone would write::

    for _ in range(iters): dist.all_reduce(buf)

timed on rank 0 with ``perf_counter``; the probe (``gpulab.training.allreduce_probe``,
what ``%gpulab nettest`` runs) times the same loop but reports the slowest
rank, as nccl-tests does. busbw = size/time * 2(n-1)/n for both. A ratio near
1 says the probe measures the network, not itself.

    python benchmarks/allreduce_probe.py [--nproc 2] [--sizes 1M,16M] [--iters 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from gpulab.training.allreduce_probe import bus_factor, parse_size

PLAIN_LOOP = r"""
import json, os, sys, time
import torch, torch.distributed as dist

sizes, iters, warmup, out = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if cuda else "gloo")
rows = []
for size in sizes:
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    rows.append({"size_bytes": size, "time_s": (time.perf_counter() - start) / iters})
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
dist.destroy_process_group()
"""


def torchrun(nproc: int, *args: str) -> None:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *args,
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"torchrun failed:\n{(p.stdout + p.stderr)[-3000:]}")


def run_probe(tmp: str, nproc: int, sizes: list[int], iters: int, warmup: int) -> dict:
    out = os.path.join(tmp, "probe.json")
    torchrun(
        nproc,
        "-m",
        "gpulab.training.allreduce_probe",
        "--size",
        ",".join(map(str, sizes)),
        "--iters",
        str(iters),
        "--warmup",
        str(warmup),
        "--json-out",
        out,
    )
    with open(out) as f:
        return {r["size_bytes"]: r["busbw_bytes_per_second"] for r in json.load(f)}


def run_plain(tmp: str, nproc: int, sizes: list[int], iters: int, warmup: int) -> dict:
    script, out = os.path.join(tmp, "plain_loop.py"), os.path.join(tmp, "plain.json")
    with open(script, "w") as f:
        f.write(PLAIN_LOOP)
    torchrun(nproc, script, json.dumps(sizes), str(iters), str(warmup), out)
    with open(out) as f:
        return {
            r["size_bytes"]: r["size_bytes"] / r["time_s"] * bus_factor(nproc) for r in json.load(f)
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default="1M,16M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    probe: dict[int, list[float]] = {s: [] for s in sizes}
    plain: dict[int, list[float]] = {s: [] for s in sizes}
    with tempfile.TemporaryDirectory(prefix="gpulab-allreduce-bench-") as tmp:
        for i in range(args.repeats):
            order = [("probe", run_probe), ("plain", run_plain)]
            for name, run in order if i % 2 == 0 else order[::-1]:
                for size, busbw in run(tmp, args.nproc, sizes, args.iters, args.warmup).items():
                    (probe if name == "probe" else plain)[size].append(busbw)
    gpu = _cuda()
    print(
        f"all-reduce busbw, {args.nproc} ranks ({'nccl' if gpu else 'gloo'}), "
        f"{args.iters} iters, median of {args.repeats} launches each, same run"
    )
    # House rule: absolute figures only on a GPU; on CPU the ratio is the result.
    print(
        f"{'size':>10} {'ratio probe/plain':>18}"
        + (f" {'probe GB/s':>12} {'plain GB/s':>12}" if gpu else "")
    )
    for size in sizes:
        a, b = statistics.median(probe[size]), statistics.median(plain[size])
        print(
            f"{size / 2**20:>8.2f}Mi {a / b:>18.3f}"
            + (f" {a / 1e9:>12.3f} {b / 1e9:>12.3f}" if gpu else "")
        )
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
