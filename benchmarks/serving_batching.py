"""Model serving on CPU: dynamic batching against batch size 1, and against LitServe.

One MLP, exported once, served three ways on 127.0.0.1, each in turn (never two
at once), all driven by the same load generator — C concurrent clients in a
closed loop, each sending one-row JSON requests:

* anchor: the gpulab server with ``--max-batch-size 1`` (no batching);
* the gpulab server with dynamic batching (``--max-batch-size B --max-latency-ms D``);
* LitServe with the same batch settings (``max_batch_size=B, batch_timeout=D``),
  its LitAPI calling the same exported program.

Every server gets one torch thread. Prints throughput and p99 latency, and the
ratios: batching against batch 1 (the issue's goal is >= 3x throughput) and
gpulab against LitServe.

Requests are JSON by default. ``--binary`` sends the gpulab rows what
``tritonclient`` sends by default (OIP's binary-data extension: raw tensor
bytes after a small JSON header, binary outputs back), which takes most of the
per-request encoding cost away; LitServe has no binary protocol, so that run
skips it. How much batching gains depends on how the model's compute compares
with the per-request HTTP cost on these cores: try ``--dims 1024,4096,4096,1024``.

    python benchmarks/serving_batching.py [--requests 1500] [--concurrency 64]
        [--max-batch-size 32] [--max-latency-ms 5] [--dims 512,2048,2048,512] [--binary]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import signal
import socket
import ssl as ssl_module
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np

STARTUP_S = 180


def build_model(dims: list[int], model_dir: str) -> None:
    import torch

    from gpulab.serving.export import export_model

    torch.manual_seed(0)
    layers = []
    for a, b in zip(dims, dims[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).eval()
    export_model(model, torch.randn(4, dims[0]), model_dir, name="mlp")


JSON_HEADERS = {"Content-Type": "application/json"}


def oip_request(row: np.ndarray, binary: bool) -> tuple[bytes, dict]:
    """One-row OIP v2 infer request (body, headers) for input ``input``: JSON, or the
    binary-data extension (raw float32 bytes after a JSON header, binary output back)."""
    if not binary:
        return json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [1, row.size],
                        "data": row.tolist(),
                    }
                ]
            }
        ).encode(), JSON_HEADERS
    raw = row.astype(np.float32).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, row.size],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + raw, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def litserve_request(row: np.ndarray) -> tuple[bytes, dict]:
    """The same row as a LitServe ``/predict`` request (body, headers)."""
    return json.dumps({"input": np.asarray(row, dtype=np.float32).tolist()}).encode(), JSON_HEADERS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                async with session.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)  # polling a starting process, not a race
    raise RuntimeError(f"{url} not ready after {STARTUP_S}s")


async def load(
    url: str,
    bodies: list[tuple[bytes, dict]],
    concurrency: int,
    duration: float | None = None,
    failures: collections.Counter | None = None,
    unix_socket: str | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> tuple[float, list[float], int]:
    """Closed loop: `concurrency` clients send `bodies` (body, headers) in turn, each
    once; or, with `duration` (seconds), over and over until that time is up.
    Returns (seconds, latencies, errors); a request that fails to connect or whose
    answer is not 200 is an error (no latency kept for a failed connection), counted
    in `failures` if given by status (or exception name) with its first answer:
    ``{(404, 'unknown model...'): 3}``. With `unix_socket`, every request goes to the
    server on that socket (a local replica listens on one), `url` naming only the path.
    With `ssl`, https connections verify the server with that context (one that trusts
    the hub's CA); connections are kept alive over the run, as for http."""
    latencies: list[float] = []
    errors = 0
    next_body = iter(bodies) if duration is None else itertools.cycle(bodies)
    connector = (
        aiohttp.UnixConnector(path=unix_socket, limit=concurrency)
        if unix_socket
        else aiohttp.TCPConnector(limit=concurrency, ssl=True if ssl is None else ssl)
    )

    async def client(session, stop_at):
        nonlocal errors
        for body, headers in next_body:
            if stop_at is not None and time.perf_counter() >= stop_at:
                return
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    answer = await r.read()
                    if r.status != 200:
                        errors += 1
                        if failures is not None:
                            failures[r.status, answer[:200].decode(errors="replace")] += 1
            except (TimeoutError, aiohttp.ClientError) as e:
                errors += 1
                if failures is not None:
                    failures[type(e).__name__, str(e)[:200]] += 1
                await asyncio.sleep(0.01)  # a refused connection answers at once
                continue
            latencies.append(time.perf_counter() - start)

    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        stop_at = None if duration is None else start + duration
        await asyncio.gather(*(client(session, stop_at) for _ in range(concurrency)))
        return time.perf_counter() - start, latencies, errors


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever of it is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    with contextlib.suppress(ProcessLookupError):  # LitServe's workers outlive their parent
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def serving(cmd: list[str], ready_url: str):
    """A server started from `cmd` in a session of its own, ready (its `ready_url`
    answers 200) inside the block, stopped with all its processes after it."""
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115
    # A session of its own: LitServe forks workers that outlive a SIGTERM to their parent.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            asyncio.run(wait_ready(ready_url, proc))
        except RuntimeError:
            log.seek(0)
            print(log.read()[-3000:], file=sys.stderr)
            raise
        yield proc
    finally:
        stop_group(proc)
        log.close()


def summary(seconds: float, latencies: list[float], errors: int, requests: int) -> dict:
    latencies = sorted(latencies)
    return {
        "throughput": requests / seconds,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "errors": errors,
    }


def run_server(cmd: list[str], ready_url: str, infer_url: str, bodies, warmup, concurrency):
    with serving(cmd, ready_url):
        asyncio.run(load(infer_url, warmup, concurrency))
        seconds, latencies, errors = asyncio.run(load(infer_url, bodies, concurrency))
    return summary(seconds, latencies, errors, len(bodies))


def litserve_command(
    model_dir: str, port: int, max_batch_size: int, max_latency_ms: float, threads: int = 1
) -> list[str]:
    """The command line of a LitServe server of the exported program in `model_dir` on
    127.0.0.1:`port` (readiness at ``/health``, calls at ``/predict`` with
    ``{"input": row}``); `threads` torch threads, 0 for torch's default."""
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--litserve-child",
        model_dir,
        str(port),
        str(max_batch_size),
        str(max_latency_ms / 1000),
        "--litserve-threads",
        str(threads),
    ]


try:
    import litserve as ls
except ImportError:  # only the LitServe row needs it
    ls = None

if ls is not None:

    class ExportedMLP(ls.LitAPI):
        """LitServe's side: the same exported program. At module level, so its workers can
        unpickle it."""

        def __init__(self, model_dir: str, threads: int = 1, **kwargs):
            super().__init__(**kwargs)
            self.model_dir = model_dir
            self.threads = threads

        def setup(self, device):
            import torch

            from gpulab.serving.export import load_model

            if self.threads:
                torch.set_num_threads(self.threads)
            self.model = load_model(self.model_dir)

        def decode_request(self, request):
            import torch

            return torch.tensor(request["input"], dtype=torch.float32)

        def batch(self, inputs):
            import torch

            return torch.stack(inputs)

        def predict(self, x):
            if x.dim() == 1:  # unbatched (max_batch_size 1)
                return self.model(x.unsqueeze(0))[0][0]
            return self.model(x)[0]

        def unbatch(self, output):
            return list(output)

        def encode_response(self, output):
            return {"output": output.tolist()}


def litserve_child(
    model_dir: str, port: int, max_batch_size: int, batch_timeout: float, threads: int = 1
) -> None:
    """Runs in its own process: LitServe serving the same exported program."""
    if ls is None:
        raise SystemExit("litserve is not installed: pip install litserve (or --skip-litserve)")
    api = ExportedMLP(
        model_dir, threads=threads, max_batch_size=max_batch_size, batch_timeout=batch_timeout
    )
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=port, log_level="warning", generate_client_file=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-latency-ms", type=float, default=5.0)
    parser.add_argument(
        "--dims",
        default="512,2048,2048,512",
        help="layer widths of the MLP (default 512,2048,2048,512)",
    )
    parser.add_argument("--skip-litserve", action="store_true")
    parser.add_argument(
        "--binary",
        action="store_true",
        help="gpulab rows use OIP's binary-data extension (LitServe is skipped)",
    )
    parser.add_argument(
        "--litserve-child", nargs=4, metavar=("DIR", "PORT", "B", "TIMEOUT"), help=argparse.SUPPRESS
    )
    parser.add_argument("--litserve-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.litserve_child:
        d, port, b, timeout = args.litserve_child
        litserve_child(d, int(port), int(b), float(timeout), args.litserve_threads)
        return 0

    dims = [int(d) for d in args.dims.split(",")]
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(dims[0], dtype=np.float32).tolist() for _ in range(64)]
    n_warm = max(args.concurrency * 4, 100)

    def oip(row):
        return oip_request(np.asarray(row, dtype=np.float32), args.binary)

    oip_bodies = [oip(rows[i % 64]) for i in range(args.requests)]
    lit_bodies = [litserve_request(rows[i % 64]) for i in range(args.requests)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as work:
        model_dir = os.path.join(work, "mlp")
        build_model(dims, model_dir)
        gpulab = [
            sys.executable,
            "-m",
            "gpulab.serving.server",
            "--model-dir",
            model_dir,
            "--threads",
            "1",
            "--max-queue",
            str(max(256, args.concurrency * 2)),
        ]
        for label, batch, delay in (
            ("gpulab, batch size 1 (anchor)", 1, 0.0),
            ("gpulab, dynamic batching", args.max_batch_size, args.max_latency_ms),
        ):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            results[label] = run_server(
                gpulab
                + [
                    "--port",
                    str(port),
                    "--max-batch-size",
                    str(batch),
                    "--max-latency-ms",
                    str(delay),
                ],
                f"{base}/v2/health/ready",
                f"{base}/v2/models/mlp/infer",
                oip_bodies,
                oip_bodies[:n_warm],
                args.concurrency,
            )
        if not (args.skip_litserve or args.binary):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            results["LitServe, same batch settings"] = run_server(
                litserve_command(model_dir, port, args.max_batch_size, args.max_latency_ms),
                f"{base}/health",
                f"{base}/predict",
                lit_bodies,
                lit_bodies[:n_warm],
                args.concurrency,
            )

    encoding = "binary-extension" if args.binary else "JSON"
    print(
        f"MLP {args.dims}, {args.requests} one-row {encoding} requests, {args.concurrency} concurrent "
        f"clients, max batch {args.max_batch_size}, max delay {args.max_latency_ms} ms, "
        "1 torch thread per server"
    )
    print(f"{'server':34} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'errors':>7}")
    for label, r in results.items():
        print(
            f"{label:34} {r['throughput']:9.1f} {r['p50'] * 1e3:9.1f} {r['p99'] * 1e3:9.1f} "
            f"{r['errors']:7d}"
        )
    anchor = results["gpulab, batch size 1 (anchor)"]
    batched = results["gpulab, dynamic batching"]
    print(
        f"dynamic batching vs batch 1: throughput {batched['throughput'] / anchor['throughput']:.2f}x "
        f"(goal >= 3x), p99 {anchor['p99'] / batched['p99']:.2f}x lower"
    )
    lit = results.get("LitServe, same batch settings")
    if lit:
        print(
            f"gpulab vs LitServe (same batch settings): throughput "
            f"{batched['throughput'] / lit['throughput']:.2f}x, p99 {lit['p99'] / batched['p99']:.2f}x lower"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
