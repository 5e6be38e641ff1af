"""Placement latency of the ledger under 200 concurrent requests, through the hub.

200 clients at once POST an allocation of 1/10 GPU to the gpulab service of a
real hub (20 simulated GPUs: room for exactly 200), through
configurable-http-proxy, each with a hub token the service must check. The
anchor, measured in the same run with the same 200 clients, is JupyterHub's own
cheapest authenticated route (GET /hub/api/user): the ratio says what placing
and recording a slice costs on top of an authenticated round trip.

    python benchmarks/ledger_latency.py [--requests 200] [--db-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
from _hub import RunningHub, percentile


async def _timed(session, method, url, headers, body=None):
    t0 = time.perf_counter()
    async with session.request(method, url, headers=headers, json=body) as r:
        await r.read()
        status = r.status
    return time.perf_counter() - t0, status


async def burst(n, make_request):
    conn = aiohttp.TCPConnector(limit=n)
    async with aiohttp.ClientSession(connector=conn) as session:
        results = await asyncio.gather(*(make_request(session, i) for i in range(n)))
    return [t for t, _ in results], [s for _, s in results]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--db-url", default="")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    n = args.requests
    gpus = -(-n // 10)
    with tempfile.TemporaryDirectory() as tmp:
        hub = RunningHub(Path(tmp) / "hub", simulate=f"{gpus}xA100-80GB", db_url=args.db_url)
        try:
            headers = hub.auth()
            alloc_url = f"{hub.api}/allocations"
            user_url = f"{hub.url}/hub/api/user"

            def place(session, i):
                return _timed(
                    session,
                    "POST",
                    alloc_url,
                    headers,
                    {"user": f"u{i}", "owner_kind": "job", "owner": f"bench-{i}", "gpu_milli": 100},
                )

            def whoami(session, i):
                return _timed(session, "GET", user_url, headers)

            asyncio.run(burst(20, whoami))  # warm both paths
            anchor, _ = asyncio.run(burst(n, whoami))
            placed, codes = asyncio.run(burst(n, place))
            allocated = hub.gpulab("GET", "/inventory").json()["nodes"][0]["gpus"]
        finally:
            hub.stop()
    ok = sum(c == 201 for c in codes)
    over = [g["allocated_milli"] for g in allocated if g["allocated_milli"] > 1000]
    result = {
        "requests": n,
        "placed": ok,
        "oversubscribed_gpus": len(over),
        "place_ms": {"p50": percentile(placed, 50) * 1e3, "p99": percentile(placed, 99) * 1e3},
        "anchor_hub_api_user_ms": {
            "p50": percentile(anchor, 50) * 1e3,
            "p99": percentile(anchor, 99) * 1e3,
        },
    }
    result["ratio_p50"] = result["place_ms"]["p50"] / result["anchor_hub_api_user_ms"]["p50"]
    result["ratio_p99"] = result["place_ms"]["p99"] / result["anchor_hub_api_user_ms"]["p99"]
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{n} concurrent placements of 1/10 GPU on {gpus} simulated GPUs "
        f"({'PostgreSQL' if args.db_url else 'SQLite'}): {ok} placed, "
        f"{len(over)} GPUs oversubscribed"
    )
    print(f"{'':28}{'p50 ms':>10}{'p99 ms':>10}")
    print(
        f"{'POST /allocations (gpulab)':28}{result['place_ms']['p50']:10.1f}"
        f"{result['place_ms']['p99']:10.1f}"
    )
    print(
        f"{'GET /hub/api/user (anchor)':28}{result['anchor_hub_api_user_ms']['p50']:10.1f}"
        f"{result['anchor_hub_api_user_ms']['p99']:10.1f}"
    )
    print(f"ratio gpulab/anchor: p50 {result['ratio_p50']:.2f}x, p99 {result['ratio_p99']:.2f}x")


if __name__ == "__main__":
    main()
