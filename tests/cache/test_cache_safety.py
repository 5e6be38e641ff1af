"""Capacity, eviction, integrity and concurrent readers."""

import hashlib
import multiprocessing
import os

import pytest
from cache_helpers import SHARD_BYTES, remote_bytes
from cache_workers import read_digest, read_many

import gpulab.cache as cache
from gpulab.cache import NodeCache, cache_key


def cached_path(cache_dir, url):
    key = cache_key(url)
    return os.path.join(cache_dir, "data", key[:2], key)


def test_lru_keeps_to_capacity_and_evicts_the_least_recently_read(server, shards, cache_dir):
    _, names = shards
    urls = [server.url(n) for n in names[:7]]
    node = NodeCache(cache_dir, capacity_bytes=5 * SHARD_BYTES)
    for url in urls[:5]:
        node.read(url)
    node.read(urls[0])  # now shard 1 is the least recently read
    node.read(urls[5])
    node.read(urls[6])

    stats = cache.stats(cache_dir)
    assert stats["used"] <= stats["capacity"] == 5 * SHARD_BYTES
    assert stats["evictions"] == 2
    kept = set(node.index.keys())
    assert kept == {cache_key(u) for u in [urls[0], urls[3], urls[4], urls[5], urls[6]]}
    assert not os.path.exists(cached_path(cache_dir, urls[1]))
    on_disk = sum(len(files) for _, _, files in os.walk(os.path.join(cache_dir, "data")))
    assert on_disk == 5


def test_a_shard_larger_than_the_cache_is_still_read(server, shards, cache_dir):
    _, names = shards
    node = NodeCache(cache_dir, capacity_bytes=SHARD_BYTES // 2)
    assert node.read(server.url(names[0])) == remote_bytes(shards, names[0])
    assert cache.stats(cache_dir)["used"] == 0


@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_a_damaged_cached_copy_is_detected_and_refetched(server, shards, cache_dir, damage):
    _, names = shards
    url = server.url(names[0])
    node = NodeCache(cache_dir, capacity_bytes="1MiB")
    node.read(url)
    path = cached_path(cache_dir, url)
    if damage == "truncate":
        os.truncate(path, SHARD_BYTES // 3)
    else:
        with open(path, "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0xFF]))

    assert node.read(url) == remote_bytes(shards, names[0])
    assert server.gets(names[0]) == 2
    stats = cache.stats(cache_dir)
    assert stats["corrupt"] == 1
    # The repaired copy is used from then on.
    assert node.read(url) == remote_bytes(shards, names[0])
    assert server.gets(names[0]) == 2


def test_a_deleted_cached_file_is_refetched(server, shards, cache_dir):
    _, names = shards
    url = server.url(names[0])
    node = NodeCache(cache_dir, capacity_bytes="1MiB")
    node.read(url)
    os.unlink(cached_path(cache_dir, url))
    assert node.read(url) == remote_bytes(shards, names[0])
    assert server.gets(names[0]) == 2


def test_a_flaky_store_is_retried(server, shards, cache_dir):
    _, names = shards
    server.failures[names[0]] = 2
    node = NodeCache(cache_dir, capacity_bytes="1MiB", retries=3, retry_backoff_s=0.01)
    assert node.read(server.url(names[0])) == remote_bytes(shards, names[0])
    assert server.gets(names[0]) == 3


@pytest.mark.timeout(60)
def test_two_processes_reading_the_same_shard_both_get_intact_bytes(tmp_path, cache_dir):
    from support.shard_server import ShardServer, write_shards

    directory = tmp_path / "big"
    (name,) = write_shards(str(directory), 1, 8 * 2**20)
    want = hashlib.blake2b((directory / name).read_bytes(), digest_size=32).hexdigest()
    ctx = multiprocessing.get_context("spawn")
    with ShardServer(str(directory), latency_s=0.2) as srv, ctx.Pool(2) as pool:
        barrier = ctx.Manager().Barrier(2)
        args = (srv.url(name), cache_dir, 64 * 2**20, barrier)
        results = [pool.apply_async(read_digest, args) for _ in range(2)]
        digests = [r.get(timeout=50) for r in results]
        assert digests == [want, want]
        assert srv.gets(name) == 1  # one download, the other process waited for it
    stats = cache.stats(cache_dir)
    assert (stats["misses"], stats["hits"]) == (1, 1)


@pytest.mark.timeout(60)
def test_concurrent_readers_under_eviction_churn_never_see_torn_bytes(server, shards, cache_dir):
    directory, names = shards
    urls = [server.url(n) for n in names[:8]]
    want = {
        server.url(n): hashlib.blake2b(remote_bytes(shards, n), digest_size=32).hexdigest()
        for n in names[:8]
    }
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        barrier = ctx.Manager().Barrier(3)
        results = [
            pool.apply_async(read_many, (urls, cache_dir, 3 * SHARD_BYTES, barrier, seed, 15))
            for seed in range(3)
        ]
        seen = [pair for r in results for pair in r.get(timeout=50)]
    assert len(seen) == 45
    assert all(digest == want[url] for url, digest in seen)
    stats = cache.stats(cache_dir)
    assert stats["used"] <= 3 * SHARD_BYTES
    assert stats["evictions"] > 0
