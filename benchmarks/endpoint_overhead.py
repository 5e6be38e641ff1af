"""What the hub's login costs an endpoint: a deployed model called through the hub,
against the same replica called directly and against LitServe, same load, same run.

Starts a real hub (``gpulab up``, simulated GPUs), deploys one MLP (one replica,
dynamic batching) as a user, then drives the same closed-loop load (C clients,
one-row requests, JSON or the binary extension) at

* anchor 1, the replica directly: its Unix socket, with the replica's
  secret (what the service itself sends it);
* the hub path: the endpoint URL under the hub, with the user's hub token:
  through configurable-http-proxy, the endpoint router's authentication (the
  hub's answer for a token is reused for a few seconds) and its forward to the
  replica;
* anchor 2, LitServe serving the same exported program with the same batch
  settings and torch's default threads (as the replica), started for its turn
  only, while the hub's deployment is idle (never two servers under load at once);
* with ``--tls``, the hub path over https: a second hub, ``gpulab up --tls
  self-signed`` (https on its public port, JupyterHub's internal TLS, the service
  and its endpoint router on https), started beside the first with the same model
  and deployment settings, called with a context that trusts its CA (keep-alive
  connections, as for http). It takes its turn like the others, while the plain
  hub is idle, and the other way round.

Machines are noisy, so the targets take turns: ``--rounds`` rounds, each running
every target once (in a rotated order) with the same number of requests after a
warmup. Prints per target the median throughput over the rounds, p50/p99 over
all the latencies and the replica's mean batch size (from its
``gpulab_serving_batch_size`` histogram), then the ratios hub / direct (goal:
throughput >= 0.9x) and hub / LitServe (goal: throughput >= 1.2x); with ``--tls``
also https / http through the hub: p50, p99 and throughput (goal: TLS costs at
most 1.15x per call, the p50 latency ratio).

    python benchmarks/endpoint_overhead.py [--requests 3000] [--rounds 3]
        [--concurrency 32] [--dims 512,4096,4096,10] [--no-litserve] [--binary] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import glob
import http.client
import json
import os
import re
import socket
import ssl
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hub import percentile, serving_hub  # noqa: E402
from serving_batching import (  # noqa: E402
    free_port,
    litserve_command,
    litserve_request,
    load,
    oip_request,
    serving,
)

DIRECT = "replica directly (anchor 1)"
HUB = "through the hub"
HUB_TLS = "through the hub, https"
#: The goal of issue 31: an endpoint call over https costs at most this much more (p50).
TLS_GOAL = 1.15
LITSERVE = "LitServe (anchor 2)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=3000, help="per target and round (default 3000)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="default: 8 per client")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dims", default="512,4096,4096,10")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-latency-ms", type=float, default=5.0)
    parser.add_argument("--no-litserve", action="store_true", help="skip the LitServe anchor")
    parser.add_argument(
        "--binary",
        action="store_true",
        help="OIP's binary-data extension (what tritonclient sends); LitServe is skipped",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also a second hub with --tls self-signed, called over https",
    )
    args = parser.parse_args(argv)

    dims = [int(d) for d in args.dims.split(",")]
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(dims[0], dtype=np.float32) for _ in range(64)]
    n_warm = args.warmup or args.concurrency * 8
    oip_bodies = [oip_request(rows[i % 64], args.binary) for i in range(args.requests)]
    skipped = None
    if args.no_litserve:
        skipped = "--no-litserve"
    elif args.binary:
        skipped = "LitServe has no binary protocol (--binary)"
    else:
        try:
            import litserve  # noqa: F401
        except ImportError:
            skipped = "litserve is not installed (make bench-deps)"
    names = [DIRECT, HUB] + ([HUB_TLS] if args.tls else []) + ([] if skipped else [LITSERVE])
    runs = {name: [] for name in names}  # per round: {throughput, latencies, errors, batch}
    deployment = {
        "name": "mlp",
        "gpu_milli": 250,
        "max_batch_size": args.max_batch_size,
        "max_latency_ms": args.max_latency_ms,
    }
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpulab-bench-endpoint-"))
        hub, client, token, model_dir = stack.enter_context(serving_hub(work, dims))
        # target: (url, Authorization, Unix socket, SSL context, the replica's metrics)
        endpoints = deploy(hub, client, token, model_dir, deployment)
        if args.tls:
            tls_hub, tls_client, tls_token, _ = stack.enter_context(
                serving_hub(work, dims, tls=True)
            )
            context = ssl.create_default_context(cafile=str(tls_hub.ca))
            url, auth, _, _, tls_metrics = deploy(
                tls_hub, tls_client, tls_token, model_dir, deployment
            )[HUB]
            endpoints[HUB_TLS] = (url, auth, None, context, tls_metrics)
        lit_bodies = [litserve_request(rows[i % 64]) for i in range(args.requests)]
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                if name == LITSERVE:
                    lit_port = free_port()
                    base = f"http://127.0.0.1:{lit_port}"
                    cmd = litserve_command(
                        model_dir,
                        lit_port,
                        args.max_batch_size,
                        args.max_latency_ms,
                        threads=0,  # torch's default, as the replica
                    )
                    with serving(cmd, f"{base}/health"):
                        run = measure(f"{base}/predict", lit_bodies, n_warm, args.concurrency)
                else:
                    url, auth, sock, context, metrics = endpoints[name]
                    signed = [(b, {**h, "Authorization": auth}) for b, h in oip_bodies]
                    run = measure(url, signed, n_warm, args.concurrency, metrics, sock, context)
                runs[name].append(run)
                print(
                    f"round {r + 1}/{args.rounds}: {name}: {run['throughput']:.1f} req/s",
                    file=sys.stderr,
                    flush=True,
                )
        client.stop_deployment("mlp")
        if args.tls:
            tls_client.stop_deployment("mlp")

    encoding = "binary-extension" if args.binary else "JSON"
    print(
        f"MLP {args.dims}, one replica (max batch {args.max_batch_size}, "
        f"{args.max_latency_ms:g} ms), {args.concurrency} closed-loop clients, one-row "
        f"{encoding} requests; {args.rounds} round(s), each target {args.requests} requests "
        f"per round after {n_warm} warmup ones, targets in turn"
    )
    for name in (HUB, HUB_TLS):
        if name in endpoints:
            print(f"{name}: {endpoints[name][0]}")
    print(
        f"{'target':28} {'req/s (median)':>14} {'per round':>22} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'errors':>7} {'batch':>6}"
    )
    results = {name: combine(rs) for name, rs in runs.items()}
    for name, r in results.items():
        rounds = "/".join(f"{t:.0f}" for t in r["per_round"])
        batch = "-" if r["batch"] is None else f"{r['batch']:.1f}"
        print(
            f"{name:28} {r['throughput']:14.1f} {rounds:>22} {r['p50'] * 1e3:8.1f} "
            f"{r['p99'] * 1e3:8.1f} {r['errors']:7d} {batch:>6}"
        )
    for name, r in results.items():
        for (status, answer), n in r["failures"].most_common(3):
            print(f"  {name}: {n} failed calls: {status} {answer}")
    if skipped:
        print(f"LitServe skipped: {skipped}")
    hub_r = results[HUB]
    for name, goal in ((DIRECT, 0.9), (LITSERVE, 1.2)):
        other = results.get(name)
        if other is None:
            continue
        ratio = hub_r["throughput"] / other["throughput"]
        print(
            f"hub / {name.split(' (')[0]}: throughput {ratio:.2f}x (goal >= {goal}x: "
            f"{'met' if ratio >= goal else 'not met'}), p50 {hub_r['p50'] / other['p50']:.2f}x, "
            f"p99 {hub_r['p99'] / other['p99']:.2f}x"
        )
    tls_r = results.get(HUB_TLS)
    if tls_r is not None:
        per_call = tls_r["p50"] / hub_r["p50"]
        print(
            f"https / http (per call): p50 {per_call:.2f}x, "
            f"p99 {tls_r['p99'] / hub_r['p99']:.2f}x, "
            f"throughput {tls_r['throughput'] / hub_r['throughput']:.2f}x "
            f"(goal: TLS costs <= {TLS_GOAL}x per call: "
            f"{'met' if per_call <= TLS_GOAL else 'not met'})"
        )
    return 0


def deploy(hub, client, token: str, model_dir: str, deployment: dict) -> dict:
    """Deploy the model on `hub` as its user; the targets it serves: the replica
    directly and the hub path, each as (url, Authorization, Unix socket, SSL context,
    the replica's metrics socket and headers)."""
    client.create_deployment(model_dir, deployment)
    dep = wait_running(client, deployment["name"])
    model = (dep.get("model") or {}).get("name") or deployment["name"]
    # The hub's only deployment: its replica's socket and secret are on disk
    # (root's, as this benchmark runs: the router reaches replicas the same way).
    sock, secret = replica_address(os.path.join(hub.data_dir, "deployments"))
    metrics = (sock, {"Authorization": f"Bearer {secret}"})
    infer = f"/v2/models/{model}/infer"
    return {
        DIRECT: (f"http://localhost{infer}", f"Bearer {secret}", sock, None, metrics),
        HUB: (f"{hub.url}{dep['path']}{infer}", f"token {token}", None, None, metrics),
    }


def measure(
    url: str,
    bodies,
    n_warm: int,
    concurrency: int,
    metrics=None,
    unix_socket=None,
    context: ssl.SSLContext | None = None,
) -> dict:
    """Warm up, then one closed-loop run of `bodies` (to `unix_socket` when given;
    https verified with `context`); with `metrics` (the replica's socket and
    headers), the mean batch size the replica ran meanwhile."""
    asyncio.run(load(url, bodies[:n_warm], concurrency, unix_socket=unix_socket, ssl=context))
    before = batch_sums(*metrics) if metrics else None
    failures = collections.Counter()
    seconds, latencies, errors = asyncio.run(
        load(url, bodies, concurrency, failures=failures, unix_socket=unix_socket, ssl=context)
    )
    batch = None
    if before is not None:
        after = batch_sums(*metrics)
        if after is not None and after[1] > before[1]:
            batch = (after[0] - before[0]) / (after[1] - before[1])
    return {
        "throughput": len(bodies) / seconds,
        "latencies": latencies,
        "errors": errors,
        "batch": batch,
        "failures": failures,
    }


def combine(rounds: list[dict]) -> dict:
    latencies = [x for r in rounds for x in r["latencies"]]
    batches = [r["batch"] for r in rounds if r["batch"] is not None]
    per_round = [r["throughput"] for r in rounds]
    failures = collections.Counter()
    for r in rounds:
        failures.update(r["failures"])
    return {
        "failures": failures,
        "throughput": statistics.median(per_round),
        "per_round": per_round,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "errors": sum(r["errors"] for r in rounds),
        "batch": statistics.mean(batches) if batches else None,
    }


_BATCH = re.compile(r"^gpulab_serving_batch_size_(sum|count)(?:\{[^}]*\})? (\S+)$", re.M)


def batch_sums(socket_path: str, headers: dict) -> tuple[float, float] | None:
    """(rows, batches) the replica has run so far, from its batch-size histogram
    (its /metrics, on the replica's socket)."""
    conn = UnixHTTPConnection(socket_path)
    try:
        conn.request("GET", "/metrics", headers=headers)
        text = conn.getresponse().read().decode(errors="replace")
    except OSError:
        return None
    finally:
        conn.close()
    found = {"sum": 0.0, "count": 0.0}
    for kind, value in _BATCH.findall(text):
        found[kind] += float(value)
    return found["sum"], found["count"]


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket: a local replica listens on one, no TCP port."""

    def __init__(self, path: str, timeout: float = 10):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def replica_address(root: str) -> tuple[str, str]:
    """(socket path, secret) of the first replica found under `root` (a deployment's
    directory, or the deployments' directory of a hub with one deployment): its
    ``replica<N>.json`` and the ``token`` beside it or in a folder above."""
    for record in sorted(glob.glob(os.path.join(root, "**", "replica*.json"), recursive=True)):
        try:
            with open(record) as f:
                path = json.load(f)["socket"]
        except (OSError, ValueError, KeyError):
            continue
        folder = os.path.dirname(record)
        while True:
            if os.path.exists(os.path.join(folder, "token")):
                with open(os.path.join(folder, "token")) as f:
                    return path, f.read().strip()
            if os.path.samefile(folder, root):
                break
            folder = os.path.dirname(folder)
    raise RuntimeError(f"no replica with a socket and a token under {root}")


def wait_running(client, name: str, timeout: float = 300) -> dict:
    """Poll the service until the deployment's replicas answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep = client.get_deployment(name)
        if dep["state"] == "running":
            return dep
        if dep["state"] == "failed":
            raise RuntimeError(dep["message"])
        time.sleep(0.5)  # polling a starting process, not a race
    raise RuntimeError(f"{name} not running after {timeout}s")


if __name__ == "__main__":
    sys.exit(main())
