"""Dataset cache: epoch 1 vs epoch 2 read throughput, with and without prefetch.

A real HTTP store on 127.0.0.1 adds a fixed latency to every request (a remote
bucket's round trip). Each run starts from an empty cache directory and reads
every shard twice, in order:

* anchor: the same shards read straight through fsspec, no cache;
* cache, no prefetch;
* cache, prefetch N shards ahead.

Prints throughputs and the ratios against the anchor and between epochs. The
issue's seed claim is that a cached second epoch is at least 10x the first.

    python benchmarks/cache_epochs.py [--shards 48] [--shard-mib 1] [--latency-ms 50] [--prefetch 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import fsspec

import gpulab.cache as cache
from gpulab.cache import CachedDataset

# The shard server is a test helper (it injects faults); it is not shipped.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from support.shard_server import ShardServer, write_shards  # noqa: E402


def timed_epoch(read_all) -> tuple[float, int]:
    start = time.perf_counter()
    nbytes = read_all()
    return time.perf_counter() - start, nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--shard-mib", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--prefetch", type=int, default=8)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as work:
        names = write_shards(os.path.join(work, "remote"), args.shards, int(args.shard_mib * 2**20))
        with ShardServer(os.path.join(work, "remote"), args.latency_ms / 1000) as server:
            urls = [server.url(n) for n in names]
            fs = fsspec.filesystem("http")

            def direct() -> int:
                return sum(len(fs.cat_file(u)) for u in urls)

            results = {}
            results["direct (no cache)"] = [timed_epoch(direct), timed_epoch(direct)]
            for label, prefetch in (
                ("cache, no prefetch", 0),
                (f"cache, prefetch {args.prefetch}", args.prefetch),
            ):
                cache_dir = os.path.join(work, f"cache-{prefetch}")
                ds = CachedDataset(
                    urls,
                    prefetch=prefetch,
                    cache_dir=cache_dir,
                    capacity_bytes=2 * args.shards * int(args.shard_mib * 2**20) + 1,
                )
                epochs = [timed_epoch(lambda ds=ds: sum(len(b) for b in ds)) for _ in range(2)]
                stats = cache.stats(cache_dir)
                results[label] = epochs
                results[label + " stats"] = stats

    mb = lambda seconds, nbytes: nbytes / seconds / 1e6  # noqa: E731
    print(
        f"{args.shards} shards x {args.shard_mib:g} MiB, {args.latency_ms:g} ms per "
        f"request, prefetch {args.prefetch}"
    )
    print(f"{'':28s}{'epoch 1 MB/s':>14s}{'epoch 2 MB/s':>14s}{'e2/e1':>9s}")
    anchor = mb(*results["direct (no cache)"][0])
    for label in ("direct (no cache)", "cache, no prefetch", f"cache, prefetch {args.prefetch}"):
        e1, e2 = (mb(*e) for e in results[label])
        print(f"{label:28s}{e1:14.1f}{e2:14.1f}{e2 / e1:8.1f}x")
    no_pf = [mb(*e) for e in results["cache, no prefetch"]]
    pf = [mb(*e) for e in results[f"cache, prefetch {args.prefetch}"]]
    stats = results[f"cache, prefetch {args.prefetch} stats"]
    print()
    print(
        f"epoch 2 / epoch 1, no prefetch:             {no_pf[1] / no_pf[0]:8.1f}x"
        "  (seed claim >= 10x)"
    )
    print(f"epoch 2 / epoch 1, prefetch {args.prefetch}:              {pf[1] / pf[0]:8.1f}x")
    print(f"epoch 1 with prefetch / without:            {pf[0] / no_pf[0]:8.1f}x")
    print(f"cached epoch 2 / direct fsspec (anchor):    {no_pf[1] / anchor:8.1f}x")
    print(f"cache overhead in epoch 1 (cached/direct):  {no_pf[0] / anchor:8.2f}x")
    print(f"hit ratio over both epochs with prefetch:   {stats['hit_ratio']:8.3f}")
    ok = no_pf[1] / no_pf[0] >= 10
    print("seed claim (epoch 2 >= 10x epoch 1):", "holds" if ok else "does NOT hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
