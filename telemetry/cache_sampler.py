"""The dataset cache's counters, read from its index by another process.

With per-user accounts each user has a cache of their own under the node's
cache folder (``<cache_dir>/<account>/``); the node's figures are then the sum
of theirs. An index is only read when it is a plain file owned by the account
that owns its folder, so a user cannot point the sampler at another file.
"""

from __future__ import annotations

import os
import sqlite3
import stat

from gpulab.cache import stats as cache_stats
from gpulab.cache.index import COUNTERS, INDEX_NAME
from gpulab.cache.settings import default_cache_dir

from .sample import SourceMissing

#: Figures that add up across users' caches: the index's counters and sizes.
_SUMMED = (*COUNTERS, "used", "entries", "capacity")


def _user_caches(cache_dir: str) -> list[str]:
    found = []
    try:
        entries = list(os.scandir(cache_dir))
    except OSError:
        return found
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            index = os.lstat(os.path.join(entry.path, INDEX_NAME))
            if (
                stat.S_ISREG(index.st_mode)
                and index.st_uid == entry.stat(follow_symlinks=False).st_uid
            ):
                found.append(entry.path)
        except OSError:
            continue
    return sorted(found)


def _sum(parts: list[dict], cache_dir: str) -> dict:
    total = {k: sum(p.get(k) or 0 for p in parts) for k in _SUMMED}
    requests = total["hits"] + total["misses"]
    total["hit_ratio"] = total["hits"] / requests if requests else None
    total["cache_dir"] = cache_dir
    total["caches"] = len(parts)
    return total


class CacheSampler:
    """Reads ``gpulab.cache.stats(cache_dir)``; the directory is resolved per sample."""

    def __init__(self, cache_dir: str | None = None):
        self.cache_dir = cache_dir

    def sample(self) -> dict:
        cache_dir = self.cache_dir or default_cache_dir()
        try:
            if os.path.exists(os.path.join(cache_dir, INDEX_NAME)):
                return cache_stats(cache_dir)
            users = _user_caches(cache_dir)
            if not users:
                return cache_stats(cache_dir)  # raises: says there is no cache yet
            return _sum([cache_stats(d) for d in users], cache_dir)
        except FileNotFoundError as err:
            raise SourceMissing(str(err)) from None
        except sqlite3.Error as err:
            raise SourceMissing(f"cannot read the cache index in {cache_dir}: {err}") from None
