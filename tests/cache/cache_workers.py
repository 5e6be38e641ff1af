"""Functions run in spawned processes (they must be importable by name)."""

import hashlib
import random

from gpulab.cache import NodeCache


def read_digest(url, cache_dir, capacity, barrier):
    cache = NodeCache(cache_dir, capacity)
    barrier.wait(timeout=60)
    return hashlib.blake2b(cache.read(url), digest_size=32).hexdigest()


def read_many(urls, cache_dir, capacity, barrier, seed, rounds):
    """Read shards in a random order under eviction churn; return digests."""
    cache = NodeCache(cache_dir, capacity)
    rng = random.Random(seed)
    barrier.wait(timeout=60)
    seen = []
    for _ in range(rounds):
        url = rng.choice(urls)
        seen.append((url, hashlib.blake2b(cache.read(url), digest_size=32).hexdigest()))
    return seen
