"""``NodeCache``: a read-through shard cache shared by every process on a node.

Layout of a cache directory::

    index.sqlite   sizes, checksums, last reads, counters (see index.py)
    data/ab/abcd…  one file per cached URL, named by a hash of the URL
    tmp/           downloads in progress
    locks/NN.lock  256 lock stripes, one flock each

How it stays safe with many readers and writers:

* A file under ``data/`` only ever appears by ``os.replace`` of a complete,
  fsynced download, so nobody can open a half-written shard.
* A reader checks size and SHA-256 checksum against the index before it uses a
  file; a torn or corrupt file (disk error, a crash, someone's ``truncate``)
  is refetched instead of being returned.
* Fetching a URL holds the flock of its stripe, so two processes asking for
  the same missing shard download it once; the second then finds it cached.
* Eviction unlinks files another process may be reading; POSIX keeps an
  unlinked file readable through descriptors already open.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from .errors import CacheError
from .index import CacheIndex, Entry, open_lock_file, open_stats_only, read_stats
from .remote import fetch_into
from .settings import default_cache_dir, default_capacity_bytes, parse_size

log = logging.getLogger(__name__)

_CHUNK = 4 * 2**20
_STALE_TMP_S = 3600


def cache_key(url: str) -> str:
    """The file name of a URL's cached copy (local paths count as absolute)."""
    if "://" not in url:
        url = "file://" + os.path.abspath(url)
    return hashlib.blake2b(url.encode(), digest_size=20).hexdigest()


class NodeCache:
    """The node-local cache in ``cache_dir`` holding at most ``capacity_bytes``.

    The capacity is this process's bound: each insertion evicts least recently
    used shards (of every user) until the cache fits it. Shards are assumed
    immutable; a changed remote object keeps its cached copy until evicted or
    ``invalidate(url)`` is called.
    """

    def __init__(
        self,
        cache_dir: str | None = None,
        capacity_bytes: int | str | None = None,
        *,
        verify: str = "checksum",
        retries: int = 3,
        retry_backoff_s: float = 0.5,
    ):
        if verify not in ("checksum", "size"):
            raise ValueError(f"verify must be 'checksum' or 'size', not {verify!r}")
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir())
        self.capacity_bytes = (
            default_capacity_bytes() if capacity_bytes is None else parse_size(capacity_bytes)
        )
        self.verify = verify
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        try:
            for sub in ("data", "tmp", "locks"):
                os.makedirs(os.path.join(self.cache_dir, sub), exist_ok=True)
            self.index = CacheIndex(self.cache_dir)
            self.index.set_capacity(self.capacity_bytes)
        except (OSError, sqlite3.Error) as err:
            raise CacheError(
                f"cannot use {self.cache_dir} as a dataset cache ({err}); set "
                "GPULAB_CACHE_DIR (or cache_dir=) to a writable node-local directory"
            ) from err
        self._remove_stale_downloads()

    def __repr__(self) -> str:
        return f"NodeCache({self.cache_dir!r}, capacity_bytes={self.capacity_bytes})"

    # -- reading -------------------------------------------------------------

    def open(self, url: str) -> BinaryIO:
        """A binary file with the bytes of ``url``, from the cache or fetched now."""
        key = cache_key(url)
        cached = self._open_verified(key)
        if cached is None:
            with self._stripe_lock(key):
                # Someone (another process, a prefetch thread) may have fetched
                # it while we waited for the lock.
                cached = self._open_verified(key, report=True)
                if cached is None:
                    return self._fetch(url, key, misses=1)
        self.index.record_hit(key, os.fstat(cached.fileno()).st_size)
        return cached

    def read(self, url: str) -> bytes:
        with self.open(url) as f:
            return f.read()

    def ensure(self, url: str) -> bool:
        """Have ``url`` cached without reading it; True when it was fetched now.

        This is what prefetching calls. It checks sizes only (the reader still
        verifies checksums) and counts no hit or miss: those are for reads.
        """
        key = cache_key(url)
        if self._looks_cached(key):
            return False
        with self._stripe_lock(key):
            if self._looks_cached(key):
                return False
            self._fetch(url, key, prefetch_ahead=1).close()
            return True

    def invalidate(self, url: str) -> None:
        """Drop ``url``'s cached copy (for a remote object that changed)."""
        key = cache_key(url)
        with self._stripe_lock(key):
            self._remove_file(key)
            self.index.forget(key)

    def stats(self) -> dict:
        return cache_stats(self.cache_dir)

    # -- internals -----------------------------------------------------------

    def _path(self, key: str) -> str:
        return os.path.join(self.cache_dir, "data", key[:2], key)

    @contextmanager
    def _stripe_lock(self, key: str) -> Iterator[None]:
        # A fixed set of lock files: one per key would pile up forever, and
        # deleting lock files safely is its own race.
        path = os.path.join(self.cache_dir, "locks", key[:2] + ".lock")
        with open_lock_file(path) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _looks_cached(self, key: str) -> bool:
        entry = self.index.lookup(key)
        try:
            return entry is not None and os.stat(self._path(key)).st_size == entry.size
        except FileNotFoundError:
            return False

    def _open_verified(self, key: str, report: bool = False) -> BinaryIO | None:
        entry = self.index.lookup(key)
        if entry is None:
            return None
        try:
            f = open(self._path(key), "rb")  # noqa: SIM115
        except FileNotFoundError:
            return None  # evicted between the lookup and the open
        problem = self._check(f, entry)
        if problem is None:
            return f
        f.close()
        if report:
            log.warning("cached copy of %s is %s; fetching it again", entry.url, problem)
            self.index.bump(corrupt=1)
        return None

    def _check(self, f: BinaryIO, entry: Entry) -> str | None:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            return f"{size} bytes instead of {entry.size} (partial)"
        if self.verify == "checksum":
            algorithm, _, expected = entry.checksum.partition(":")
            try:
                digest = hashlib.new(algorithm)
            except ValueError:
                return f"recorded with an unknown checksum {algorithm!r}"
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
            f.seek(0)
            if digest.hexdigest() != expected:
                return "corrupt (checksum mismatch)"
        return None

    def _fetch(self, url: str, key: str, **counters: int) -> BinaryIO:
        """Download into tmp/, publish atomically, index it; caller holds the stripe."""
        tmp = tempfile.NamedTemporaryFile(  # noqa: SIM115
            dir=os.path.join(self.cache_dir, "tmp"), prefix=key + ".", delete=False
        )
        reader = None
        try:
            with tmp:
                size, checksum = fetch_into(
                    url, tmp, retries=self.retries, backoff_s=self.retry_backoff_s
                )
                tmp.flush()
                os.fsync(tmp.fileno())
                # Shared by the node's users: readable by all, written by none.
                os.fchmod(tmp.fileno(), 0o644)
            # Opened before it is published, so an eviction racing with us
            # cannot take the file from under the caller.
            reader = open(tmp.name, "rb")  # noqa: SIM115
            os.makedirs(os.path.dirname(self._path(key)), exist_ok=True)
            os.replace(tmp.name, self._path(key))
        except BaseException:
            if reader is not None:
                reader.close()
            _unlink(tmp.name)
            raise
        try:
            self.index.insert_and_evict(
                Entry(key, url, size, checksum),
                self.capacity_bytes,
                self._remove_file,
                bytes_from_remote=size,
                **counters,
            )
        except BaseException:
            reader.close()
            raise
        return reader

    def _remove_file(self, key: str) -> None:
        _unlink(self._path(key))

    def _remove_stale_downloads(self) -> None:
        # Downloads of processes that died; a live download keeps its mtime fresh.
        tmp_dir = os.path.join(self.cache_dir, "tmp")
        cutoff = time.time() - _STALE_TMP_S
        for name in os.listdir(tmp_dir):
            path = os.path.join(tmp_dir, name)
            try:
                if os.stat(path).st_mtime < cutoff:
                    _unlink(path)
            except FileNotFoundError:
                pass


def _unlink(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def cache_stats(cache_dir: str | None = None) -> dict:
    """Cumulative counters and usage of a cache, readable from any process.

    Keys: ``hits``, ``misses``, ``hit_ratio`` (None before the first read),
    ``bytes_from_cache``, ``bytes_from_remote``, ``evictions``,
    ``prefetch_ahead`` (shards fetched by prefetch before they were read),
    ``corrupt`` (cached copies found damaged and refetched), ``used``,
    ``capacity`` (bytes), ``entries``, ``cache_dir``.
    Raises ``FileNotFoundError`` when no cache exists there yet.
    """
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    conn = open_stats_only(cache_dir)
    try:
        result = read_stats(conn)
    finally:
        conn.close()
    requests = result["hits"] + result["misses"]
    result["hit_ratio"] = result["hits"] / requests if requests else None
    result["cache_dir"] = cache_dir
    return result
