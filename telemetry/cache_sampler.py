"""The dataset cache's counters, read from its index by another process.

With per-user accounts each user has a cache of their own under the node's
cache folder (``<cache_dir>/<account>/``); the node's figures are then the sum
of theirs. An index is only read when it is a plain file owned by the account
that owns its folder, so a user cannot point the sampler at another file.

A user's index is the user's to write, so root (the service, the node agent) never
opens it: SQLite would run what the user put there (a view over an endless query
held the sampler, and with it every telemetry figure of the node, for good) and,
opening its journal as root, hand that file to the index's owner (a hard link to
``/etc/shadow`` there became the user's). A process of the folder's owner reads it
(``python -I -m gpulab.cache.index``), within OWNER_READ_TIMEOUT_S, at most every
OWNER_READ_EVERY_S; a cache it cannot read in time is left out of the sum, and tried
again only after OWNER_RETRY_AFTER_S.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import time

from gpulab.cache import stats as cache_stats
from gpulab.cache.index import COUNTERS, INDEX_NAME
from gpulab.cache.settings import default_cache_dir

from .sample import SourceMissing

log = logging.getLogger("gpulab.telemetry")

#: Figures that add up across users' caches: the index's counters and sizes.
_SUMMED = (*COUNTERS, "used", "entries", "capacity")
#: How long a user's index may take to read, as the user, before it is left out.
OWNER_READ_TIMEOUT_S = 5.0
#: How often a user's cache is read again (a process each time: not every sample).
OWNER_READ_EVERY_S = 10.0
#: How long a cache that could not be read waits before it is tried again (its wait
#: held the node's sampling).
OWNER_RETRY_AFTER_S = 300.0


def _user_caches(cache_dir: str) -> list[tuple[str, os.stat_result]]:
    """Each user's cache folder under ``cache_dir`` with its index, and the folder's stat."""
    found = []
    try:
        entries = list(os.scandir(cache_dir))
    except OSError:
        return found
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            folder = entry.stat(follow_symlinks=False)
            index = os.lstat(os.path.join(entry.path, INDEX_NAME))
            if stat.S_ISREG(index.st_mode) and index.st_uid == folder.st_uid:
                found.append((entry.path, folder))
        except OSError:
            continue
    return sorted(found, key=lambda f: f[0])


def read_as_owner(folder: str, owner: os.stat_result) -> dict:
    """The counters of the cache in ``folder``, read by a process of its owner."""
    run = subprocess.run(
        [sys.executable, "-I", "-m", "gpulab.cache.index", folder],
        user=owner.st_uid,
        group=owner.st_gid,
        extra_groups=[],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=OWNER_READ_TIMEOUT_S,
    )
    if run.returncode:
        raise RuntimeError((run.stderr.strip().splitlines() or ["no output"])[-1])
    found = json.loads(run.stdout)
    if not isinstance(found, dict):
        raise ValueError("not an object")
    # Each figure as a number or nothing: the owner could have written anything.
    return {
        k: v if isinstance(v, int) and not isinstance(v, bool) else None
        for k, v in found.items()
        if k in _SUMMED
    }


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
        #: folder -> (when to read it again, its counters) of caches other accounts own.
        self._read: dict[str, tuple[float, dict | None]] = {}

    def sample(self) -> dict:
        cache_dir = self.cache_dir or default_cache_dir()
        try:
            if os.path.exists(os.path.join(cache_dir, INDEX_NAME)):
                return cache_stats(cache_dir)
            users = _user_caches(cache_dir)
            if not users:
                return cache_stats(cache_dir)  # raises: says there is no cache yet
            parts = [self._counters(folder, owner) for folder, owner in users]
            return _sum([p for p in parts if p is not None], cache_dir)
        except FileNotFoundError as err:
            raise SourceMissing(str(err)) from None
        except sqlite3.Error as err:
            raise SourceMissing(f"cannot read the cache index in {cache_dir}: {err}") from None

    def _counters(self, folder: str, owner: os.stat_result) -> dict | None:
        """One user's cache: read here when it is this process's own, else as its owner
        (at most every OWNER_READ_EVERY_S); None when it cannot be read."""
        if owner.st_uid == os.geteuid():
            return cache_stats(folder)
        due, counters = self._read.get(folder, (0.0, None))
        if time.monotonic() < due:
            return counters
        try:
            counters = read_as_owner(folder, owner)
            wait = OWNER_READ_EVERY_S
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            log.warning("Dataset cache %s left out of the node's figures: %s", folder, e)
            counters, wait = None, OWNER_RETRY_AFTER_S
        self._read[folder] = (time.monotonic() + wait, counters)
        return counters
