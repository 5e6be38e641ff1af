"""Bad input gets an error that names the URL and says what to do."""

import pytest

import gpulab.cache as cache
from gpulab.cache import CachedDataset, NodeCache, RemoteNotFoundError, UnknownProtocolError


def test_unknown_protocol_names_the_url(cache_dir):
    with pytest.raises(UnknownProtocolError, match=r"nosuch://bucket/a.bin.*install"):
        cache.open("nosuch://bucket/a.bin", cache_dir=cache_dir)


def test_missing_remote_file_names_the_url(server, cache_dir):
    url = server.url("absent.bin")
    with pytest.raises(RemoteNotFoundError, match="absent.bin: not found.*Check the URL"):
        cache.open(url, cache_dir=cache_dir)
    with pytest.raises(FileNotFoundError):  # usable as the builtin kind too
        cache.open(url, cache_dir=cache_dir)
    assert cache.stats(cache_dir)["used"] == 0


def test_missing_local_file(tmp_path, cache_dir):
    with pytest.raises(RemoteNotFoundError, match="nothing-here"):
        cache.open(str(tmp_path / "nothing-here"), cache_dir=cache_dir)


def test_write_modes_are_refused(cache_dir):
    with pytest.raises(ValueError, match="read-only"):
        cache.open("http://127.0.0.1:1/x", "wb", cache_dir=cache_dir)


def test_bad_capacity_from_the_environment(monkeypatch, cache_dir):
    monkeypatch.setenv("GPULAB_CACHE_CAPACITY_BYTES", "lots")
    with pytest.raises(ValueError, match="GPULAB_CACHE_CAPACITY_BYTES.*20GiB"):
        NodeCache(cache_dir)
    monkeypatch.setenv("GPULAB_CACHE_CAPACITY_BYTES", "2GiB")
    assert NodeCache(cache_dir).capacity_bytes == 2 * 2**30


def test_dataset_input_checks(server, cache_dir):
    with pytest.raises(ValueError, match="no shards"):
        CachedDataset([], cache_dir=cache_dir)
    with pytest.raises(ValueError, match="prefetch"):
        CachedDataset(["http://x/a"], prefetch=-1, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="counts down"):
        CachedDataset("http://x/a-{9..1}", cache_dir=cache_dir)
    with pytest.raises(FileNotFoundError, match="matches no files"):
        CachedDataset(server.url("none-*.bin"), cache_dir=cache_dir)
    with pytest.raises(TypeError, match="int"):
        CachedDataset(["http://x/a"], cache_dir=cache_dir)["0"]


def test_stats_of_a_cache_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset cache"):
        cache.stats(str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


def test_an_unusable_cache_directory_says_what_to_do(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(cache.CacheError, match="cannot use .*GPULAB_CACHE_DIR"):
        NodeCache(str(blocker / "cache"))
