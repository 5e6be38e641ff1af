"""What the hub's login costs an endpoint: a deployed model called through the hub
against the same replica called directly, same load, same run.

Starts a real hub (``gpulab up``, simulated GPUs), deploys one MLP (one replica,
dynamic batching) as a user, then drives the same closed-loop load (C clients,
one-row requests, JSON or the binary extension) at

* the anchor: the replica's own port on 127.0.0.1, with the replica's secret
  (what the service itself sends it);
* the endpoint URL under the hub, with the user's hub token: through
  configurable-http-proxy, the service's authentication (the token's identity
  is cached by the hub client for a minute) and its forward to the replica.

Prints throughput and p50/p99 latency of both and their ratio.

    python benchmarks/endpoint_overhead.py [--requests 1500] [--concurrency 32] [--binary]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hub import RunningHub, percentile  # noqa: E402
from serving_batching import build_model, load, oip_request  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dims", default="512,2048,2048,512")
    parser.add_argument(
        "--binary",
        action="store_true",
        help="OIP's binary-data extension (what tritonclient sends)",
    )
    args = parser.parse_args(argv)

    from gpulab.client import Client

    dims = [int(d) for d in args.dims.split(",")]
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(dims[0], dtype=np.float32) for _ in range(64)]

    bodies = [oip_request(rows[i % 64], args.binary) for i in range(args.requests)]
    warm = bodies[: max(100, args.concurrency * 4)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-endpoint-") as work:
        hub = RunningHub(os.path.join(work, "hub"), simulate="2xA100-80GB")
        try:
            token = hub.create_user("bench")
            model_dir = os.path.join(work, "mlp")
            build_model(dims, model_dir)
            client = Client(hub.api, token=token)
            client.create_deployment(
                model_dir,
                {"name": "mlp", "gpu_milli": 250, "max_batch_size": 32, "max_latency_ms": 5},
            )
            dep = wait_running(client, "mlp")
            dep_dir = os.path.join(hub.data_dir, "deployments", dep["id"])
            with open(os.path.join(dep_dir, "replica0.json")) as f:
                port = json.load(f)["port"]
            with open(os.path.join(dep_dir, "token")) as f:
                secret = f.read().strip()
            targets = {
                "replica directly (anchor)": (
                    f"http://127.0.0.1:{port}/v2/models/mlp/infer",
                    f"Bearer {secret}",
                ),
                "through the hub": (
                    f"{hub.url}{dep['path']}/v2/models/mlp/infer",
                    f"token {token}",
                ),
            }
            for label, (url, auth) in targets.items():
                signed = [(b, {**h, "Authorization": auth}) for b, h in bodies]
                asyncio.run(
                    load(
                        url, [(b, {**h, "Authorization": auth}) for b, h in warm], args.concurrency
                    )
                )
                seconds, latencies, errors = asyncio.run(load(url, signed, args.concurrency))
                results[label] = {
                    "throughput": len(signed) / seconds,
                    "p50": percentile(latencies, 50),
                    "p99": percentile(latencies, 99),
                    "errors": errors,
                }
            client.stop_deployment("mlp")
        finally:
            hub.stop()

    encoding = "binary-extension" if args.binary else "JSON"
    print(
        f"MLP {args.dims}, one replica (max batch 32, 5 ms), {args.requests} one-row {encoding} "
        f"requests, {args.concurrency} concurrent clients"
    )
    print(f"{'target':28} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'errors':>7}")
    for label, r in results.items():
        print(
            f"{label:28} {r['throughput']:9.1f} {r['p50'] * 1e3:9.1f} {r['p99'] * 1e3:9.1f} "
            f"{r['errors']:7d}"
        )
    anchor, hub_r = results["replica directly (anchor)"], results["through the hub"]
    print(
        f"through the hub vs directly: throughput {hub_r['throughput'] / anchor['throughput']:.2f}x, "
        f"p50 {hub_r['p50'] / anchor['p50']:.2f}x, p99 {hub_r['p99'] / anchor['p99']:.2f}x"
    )
    return 0


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
