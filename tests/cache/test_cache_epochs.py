"""Read-through, hit ratio and prefetch against a real HTTP store."""

import pickle

from cache_helpers import remote_bytes

import gpulab.cache as cache
from gpulab.cache import CachedDataset


def test_second_epoch_is_served_from_the_cache(server, shards, cache_dir):
    _, names = shards
    ds = CachedDataset([server.url(n) for n in names], prefetch=4, cache_dir=cache_dir)

    first = list(ds)
    after_first = cache.stats(cache_dir)
    second = list(ds)
    after_second = cache.stats(cache_dir)

    assert first == second == [remote_bytes(shards, n) for n in names]
    hits = after_second["hits"] - after_first["hits"]
    misses = after_second["misses"] - after_first["misses"]
    assert hits / (hits + misses) >= 0.95
    # Each shard crossed the network once, whoever (reader or prefetch) asked.
    assert all(server.gets(n) == 1 for n in names)
    assert after_second["bytes_from_remote"] == sum(len(b) for b in first)


def test_prefetch_fetches_ahead_of_the_reader(server, shards, cache_dir):
    _, names = shards
    ds = CachedDataset([server.url(n) for n in names], prefetch=4, cache_dir=cache_dir)
    list(ds)
    stats = cache.stats(cache_dir)
    # The first shard is always the reader's own miss; prefetch brings the rest.
    assert stats["prefetch_ahead"] >= len(names) // 2
    assert stats["prefetch_ahead"] + stats["misses"] == len(names)


def test_stopping_early_does_not_fetch_the_whole_dataset(server, shards, cache_dir):
    _, names = shards
    ds = CachedDataset([server.url(n) for n in names], prefetch=3, cache_dir=cache_dir)
    for i, _ in enumerate(ds):
        if i == 1:
            break
    fetched = sum(server.gets(n) for n in names)
    assert fetched <= 2 + 3


def test_random_access_and_pickling(server, shards, cache_dir):
    _, names = shards
    ds = CachedDataset([server.url(n) for n in names], prefetch=0, cache_dir=cache_dir)
    assert len(ds) == len(names)
    assert ds[-1] == remote_bytes(shards, names[-1])
    # DataLoader workers get a pickled copy; it must reopen the same cache.
    again = pickle.loads(pickle.dumps(ds))
    assert again[-1] == ds[-1]
    assert server.gets(names[-1]) == 1


def test_open_returns_a_file_and_uses_the_environment(server, shards, tmp_path):
    _, names = shards
    with cache.open(server.url(names[0])) as f:
        assert f.read(10) == remote_bytes(shards, names[0])[:10]
    assert cache.stats()["cache_dir"] == str(tmp_path / "env-cache")
    assert cache.stats()["misses"] == 1


def test_patterns_expand_ranges_and_globs(server, shards, cache_dir):
    directory, names = shards
    ranged = CachedDataset(server.url("shard-{0003..0005}.bin"), cache_dir=cache_dir)
    assert ranged.urls == [server.url(n) for n in names[3:6]]
    globbed = CachedDataset(server.url("shard-001*.bin"), cache_dir=cache_dir)
    assert globbed.urls == [server.url(n) for n in names[10:20]]
    local = CachedDataset(str(directory / "shard-000*.bin"), cache_dir=cache_dir)
    assert len(local) == 10
    assert local[0] == remote_bytes(shards, names[0])


def test_local_files_read_through_the_cache(shards, cache_dir):
    directory, names = shards
    url = (directory / names[0]).as_uri()
    with cache.open(url, cache_dir=cache_dir) as f:
        assert f.read() == remote_bytes(shards, names[0])
    cache.open(str(directory / names[0]), cache_dir=cache_dir).close()
    stats = cache.stats(cache_dir)
    assert (stats["misses"], stats["hits"]) == (1, 1)  # same key for path and URL
