"""The dataset cache's counters, read from its index by another process."""

from __future__ import annotations

import sqlite3

from gpulab.cache import stats as cache_stats
from gpulab.cache.settings import default_cache_dir

from .sample import SourceMissing


class CacheSampler:
    """Reads ``gpulab.cache.stats(cache_dir)``; the directory is resolved per sample."""

    def __init__(self, cache_dir: str | None = None):
        self.cache_dir = cache_dir

    def sample(self) -> dict:
        cache_dir = self.cache_dir or default_cache_dir()
        try:
            return cache_stats(cache_dir)
        except FileNotFoundError as err:
            raise SourceMissing(str(err)) from None
        except sqlite3.Error as err:
            raise SourceMissing(f"cannot read the cache index in {cache_dir}: {err}") from None
