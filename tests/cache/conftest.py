import os

import pytest
from cache_helpers import SHARD_BYTES
from support.shard_server import ShardServer, write_shards


@pytest.fixture
def shards(tmp_path):
    """40 shard files of random bytes in a directory the server serves."""
    directory = tmp_path / "remote"
    names = write_shards(str(directory), 40, SHARD_BYTES)
    return directory, names


@pytest.fixture
def server(shards):
    """A real HTTP store on 127.0.0.1 with 20 ms added to every request."""
    directory, _ = shards
    with ShardServer(str(directory), latency_s=0.02) as srv:
        yield srv


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")


@pytest.fixture(autouse=True)
def _no_env_cache(monkeypatch, tmp_path):
    # Never touch the real ~/.cache of whoever runs the tests.
    monkeypatch.setenv("GPULAB_CACHE_DIR", os.fspath(tmp_path / "env-cache"))
    monkeypatch.delenv("GPULAB_CACHE_CAPACITY_BYTES", raising=False)
