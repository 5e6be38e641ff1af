"""``%gpulab dashboard`` and ``%gpulab nettest``: the live panel and the all-reduce probe.

``nettest`` runs ``gpulab.training.allreduce_probe`` under a real torchrun on this
server (``--nproc`` processes; NCCL on CUDA, gloo otherwise), prints algbw and
busbw (nccl-tests definitions), and records the result with the gpulab service
so the dashboard's Network tab shows it. For a probe across several nodes, run
the probe under torchrun with rendezvous arguments on each node (see
``docs/howto/dashboard.md``) and report its JSON with
``Client().report_allreduce(...)``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

NETTEST_USAGE = "%gpulab nettest [--size BYTES] [--iters N] [--nproc N] [--warmup N] [--no-report]"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%gpulab nettest", add_help=False, exit_on_error=False)
    p.add_argument("--size", default="16M", help="bytes per all-reduce: 65536, 64K, 16M, 1G")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--no-report", action="store_true")
    return p


class NettestError(Exception):
    """Bad arguments or a probe that failed; the message says what to do."""


def parse_nettest(line: str) -> argparse.Namespace:
    try:
        args, extra = _parser().parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as e:
        raise NettestError(f"{e}\nusage: {NETTEST_USAGE}") from None
    if extra:
        raise NettestError(f"unknown argument(s) {' '.join(extra)}\nusage: {NETTEST_USAGE}")
    if args.iters < 1 or args.warmup < 0 or (args.nproc is not None and args.nproc < 1):
        raise NettestError(f"--iters and --nproc must be >= 1, --warmup >= 0\n"
                           f"usage: {NETTEST_USAGE}")
    return args


def default_nproc() -> int:
    """One rank per visible GPU; 2 on CPU (the smallest all-reduce that crosses processes)."""
    try:
        import torch
        if torch.cuda.is_available():
            return max(1, torch.cuda.device_count())
    except ImportError:
        pass
    return 2


def run_probe(size: str, iters: int, nproc: int, warmup: int = 5,
              timeout: float = 600.0) -> dict:
    """Run the probe under torchrun on this machine; return rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="gpulab-nettest-") as tmp:
        out = os.path.join(tmp, "result.json")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", "-m", "gpulab.training.allreduce_probe",
                "--size", str(size), "--iters", str(iters), "--warmup", str(warmup),
                "--json-out", out]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise NettestError(f"the probe took longer than {timeout:g} s; "
                               "try a smaller --size or fewer --iters") from None
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise NettestError(f"the probe failed (exit {proc.returncode}):\n{tail}")
        with open(out) as f:
            results = json.load(f)
    return max(results, key=lambda r: r["size_bytes"])


def format_result(r: dict) -> str:
    n = r["world_size"]
    return (f"all-reduce of {r['size_bytes'] / 2**20:.2f} MiB over {n} ranks "
            f"({r['backend']}, nodes: {', '.join(r.get('nodes') or [])})\n"
            f"  time   {r['time_s'] * 1e3:.3f} ms per all-reduce ({r['iters']} timed)\n"
            f"  algbw  {r['algbw_bytes_per_second'] / 1e9:.3f} GB/s   (size / time)\n"
            f"  busbw  {r['busbw_bytes_per_second'] / 1e9:.3f} GB/s   "
            f"(algbw * 2(n-1)/n = algbw * {2 * (n - 1) / n:.3f})"
            + ("\n  one rank: nothing crosses a link, so busbw is 0 by definition; "
               "use --nproc 2 or more, or run the probe across nodes" if n == 1 else ""))


def nettest(line: str) -> dict | None:
    """The ``%gpulab nettest`` subcommand; prints and returns the result."""
    try:
        args = parse_nettest(line)
        result = run_probe(args.size, args.iters, args.nproc or default_nproc(),
                           args.warmup, args.timeout)
    except NettestError as e:
        print(f"nettest: {e}")
        return None
    print(format_result(result))
    if args.no_report:
        return result
    try:
        from gpulab.client import Client
        Client().report_allreduce({k: result[k] for k in (
            "busbw_bytes_per_second", "algbw_bytes_per_second", "size_bytes", "world_size",
            "backend", "nodes")})
        print("  recorded: the dashboard's Network tab shows it")
    except Exception as e:  # the measurement stands even if the service can't take it
        print(f"  not recorded with the gpulab service: {e}")
    return result


def dashboard(line: str):
    """The ``%gpulab dashboard`` subcommand: display a live Dashboard."""
    from IPython.display import display

    from gpulab.widgets import Dashboard

    if line.strip():
        print(f"%gpulab dashboard takes no arguments (got {line.strip()!r}); "
              "for options use: from gpulab.widgets import Dashboard; Dashboard(...)")
        return None
    board = Dashboard()
    display(board)
    return None
