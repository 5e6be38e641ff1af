"""``%quantize`` schemes: size and speed of each against the fp32 model, same run.

One MLP and one example batch; for every scheme (and engine, where two can run
it) ``gpulab.serving.quantize.quantize`` measures the fp32 anchor and the
quantized copy back to back: median latency over ``--runs`` calls, serialized
size, output error. Prints the ratios. A scheme this machine cannot run (fp8
dynamic without a GPU of compute capability >= 8.9) is listed with the reason.

    python benchmarks/quantize_schemes.py [--dims 1024,4096,1024] [--batch 8] [--runs 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys

import torch

from gpulab.serving.quantize import SCHEMES, QuantizeError, quantize

# Every scheme with its default engine, plus int8-dynamic on torchao to compare engines.
CASES = [(s, "auto") for s in SCHEMES] + [("int8-dynamic", "torchao")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="1024,4096,1024")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: steady figures on a shared machine)",
    )
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    dims = [int(d) for d in args.dims.split(",")]
    torch.manual_seed(0)
    layers = []
    for a, b in zip(dims, dims[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).eval().to(args.device)
    example = torch.randn(args.batch, dims[0], device=args.device)

    print(
        f"MLP {args.dims}, batch {args.batch}, {args.device}, {args.threads} torch thread(s), "
        f"median of {args.runs} runs; ratios against the fp32 model measured alongside"
    )
    print(
        f"{'scheme':13} {'engine':9} {'size':>9} {'smaller':>8} {'fp32 ms':>9} {'quant ms':>9} "
        f"{'faster':>7} {'rel err':>8}"
    )
    for scheme, engine in CASES:
        try:
            r = quantize(model, scheme, engine=engine, example=example, runs=args.runs)
        except QuantizeError as exc:
            print(f"{scheme:13} {engine:9} cannot run here: {exc}")
            continue
        print(
            f"{scheme:13} {r.engine:9} {r.size_after / 2**20:7.2f}Mi {r.size_ratio:7.2f}x "
            f"{r.latency_before_s * 1e3:9.3f} {r.latency_after_s * 1e3:9.3f} {r.speedup:6.2f}x "
            f"{r.relative_error:8.4f}"
        )
        del r
    return 0


if __name__ == "__main__":
    sys.exit(main())
