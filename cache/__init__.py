"""gpulab.cache: a node-local dataset cache with prefetch, over fsspec.

    import gpulab.cache

    with gpulab.cache.open("https://data.example/train-0001.tar") as f:
        header = f.read(512)

    ds = gpulab.cache.CachedDataset("https://data.example/train-{0000..0099}.tar",
                                    prefetch=8)
    for shard in ds:          # bytes of each shard, the next 8 fetched ahead
        ...

    gpulab.cache.stats()      # hits, misses, bytes, evictions, used, capacity

Every process of every user on a node shares one cache directory
(``$GPULAB_CACHE_DIR``, default ``~/.cache/gpulab/datasets``) bounded by
``$GPULAB_CACHE_CAPACITY_BYTES`` (default 20 GiB) with LRU eviction.
"""

from __future__ import annotations

import functools
import os
from typing import BinaryIO

from gpulab.training.lineage import note_read

from .dataset import CachedDataset
from .errors import CacheError, RemoteNotFoundError, RemoteReadError, UnknownProtocolError
from .settings import default_cache_dir, default_capacity_bytes, parse_size
from .store import NodeCache, cache_key
from .store import cache_stats as stats

__all__ = [
    "open",
    "stats",
    "CachedDataset",
    "NodeCache",
    "cache_key",
    "CacheError",
    "RemoteNotFoundError",
    "RemoteReadError",
    "UnknownProtocolError",
    "default_cache_dir",
    "default_capacity_bytes",
    "parse_size",
]


@functools.lru_cache(maxsize=16)
def _node_cache(cache_dir: str, capacity_bytes: int) -> NodeCache:
    return NodeCache(cache_dir, capacity_bytes)


def open(
    url: str,
    mode: str = "rb",
    *,
    cache_dir: str | None = None,
    capacity_bytes: int | str | None = None,
) -> BinaryIO:
    """Open ``url`` for reading through the node cache (fetching it if needed).

    Returns a regular binary file on the cached copy; close it (``with``). Inside
    a gpulab job the read is noted for the model's lineage, the URL as its dataset.
    """
    if mode != "rb":
        raise ValueError(f"the dataset cache is read-only; open with mode 'rb', not {mode!r}")
    # Resolved here so a changed environment gets its own cache object.
    cache_dir = cache_dir or default_cache_dir()
    capacity = default_capacity_bytes() if capacity_bytes is None else parse_size(capacity_bytes)
    f = _node_cache(cache_dir, capacity).open(url)
    note_read(url, url, os.fstat(f.fileno()).st_size)
    return f
