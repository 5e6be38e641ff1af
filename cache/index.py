"""The cache's index: one SQLite file shared by every process on the node.

It records, per cached shard, its size and checksum (to tell a good file from a
torn or corrupt one) and when it was last read (for LRU eviction), plus the
cumulative counters the telemetry sampler reads from another process.

SQLite in WAL mode gives many concurrent readers and one writer at a time;
every change is a short ``BEGIN IMMEDIATE`` transaction, so decisions such as
"which shards to evict" are made on a consistent view even when several users'
processes insert at once. Connections are per thread and per process (a
connection must not cross a ``fork``, which DataLoader workers do).
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

INDEX_NAME = "index.sqlite"

COUNTERS = (
    "hits",
    "misses",
    "bytes_from_cache",
    "bytes_from_remote",
    "evictions",
    "prefetch_ahead",
    "corrupt",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    size INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    created REAL NOT NULL,
    last_access REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_lru ON entries (last_access);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Entry:
    key: str
    url: str
    size: int
    checksum: str


class CacheIndex:
    """The index of one cache directory."""

    def __init__(self, cache_dir: str):
        self.path = os.path.join(cache_dir, INDEX_NAME)
        self._local = threading.local()
        # Creating the schema and switching to WAL must not race with another
        # process doing the same, or one of them sees "database is locked".
        with open_lock_file(os.path.join(cache_dir, "index.lock")) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            # A lost counter update on power loss is fine; an fsync per read is not.
            local.conn.execute("PRAGMA synchronous=NORMAL")
            local.pid = os.getpid()
        return local.conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def lookup(self, key: str) -> Entry | None:
        row = (
            self._conn()
            .execute("SELECT key, url, size, checksum FROM entries WHERE key = ?", (key,))
            .fetchone()
        )
        return Entry(*row) if row else None

    def record_hit(self, key: str, nbytes: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE entries SET last_access = ? WHERE key = ?", (time.time(), key))
            _bump(conn, hits=1, bytes_from_cache=nbytes)

    def bump(self, **counters: int) -> None:
        with self._write() as conn:
            _bump(conn, **counters)

    def forget(self, key: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM entries WHERE key = ?", (key,))

    def insert_and_evict(
        self, entry: Entry, capacity_bytes: int, remove_file: Callable[[str], None], **counters: int
    ) -> list[str]:
        """Add ``entry``, then evict least recently used shards down to capacity.

        Files are removed *inside* the transaction: a process that still sees
        the old row then finds no file and refetches, and no process can
        write a fresh copy of an evicted key before its old file is gone.
        Returns the evicted keys (the new entry is one of them when it alone
        exceeds the capacity; its reader already holds the file open).
        """
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                (entry.key, entry.url, entry.size, entry.checksum, now, now),
            )
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('capacity', ?)", (str(capacity_bytes),)
            )
            used = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
            evicted = []
            if used > capacity_bytes:
                victims = conn.execute(
                    "SELECT key, size FROM entries ORDER BY last_access, rowid"
                ).fetchall()
                for key, size in victims:
                    if used <= capacity_bytes:
                        break
                    remove_file(key)
                    conn.execute("DELETE FROM entries WHERE key = ?", (key,))
                    used -= size
                    evicted.append(key)
            _bump(conn, evictions=len(evicted), **counters)
        return evicted

    def set_capacity(self, capacity_bytes: int) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('capacity', ?)", (str(capacity_bytes),)
            )

    def keys(self) -> list[str]:
        return [k for (k,) in self._conn().execute("SELECT key FROM entries")]

    def stats(self) -> dict:
        return read_stats(self._conn())


def _bump(conn: sqlite3.Connection, **counters: int) -> None:
    for name, delta in counters.items():
        if delta:
            conn.execute(
                "INSERT INTO counters VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, delta),
            )


def read_stats(conn: sqlite3.Connection) -> dict:
    """Counters, usage and capacity, as plain ints.

    Only the known counters, and only integer values, leave the database: the
    index is its user's to write, and a counter of half a gigabyte of text would
    otherwise be copied into every reader (the telemetry sampler's among them)."""
    stats = {name: 0 for name in COUNTERS}
    marks = ",".join("?" * len(COUNTERS))
    stats.update(
        conn.execute(
            f"SELECT name, value FROM counters WHERE name IN ({marks}) "
            "AND typeof(value) = 'integer'",
            COUNTERS,
        )
    )
    used, entries = conn.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM entries").fetchone()
    capacity = conn.execute(
        "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'capacity' AND length(value) <= 20"
    ).fetchone()
    stats.update(used=used, entries=entries, capacity=capacity[0] if capacity else None)
    return stats


def open_lock_file(path: str):
    """A file to ``flock``, opened read-only so users who share the cache
    (and can't write each other's files) can all lock it."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_CREAT, 0o666), "rb")


def open_stats_only(cache_dir: str) -> sqlite3.Connection:
    """A connection for reading counters that never creates a cache."""
    path = os.path.join(cache_dir, INDEX_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no dataset cache at {cache_dir} yet (no {INDEX_NAME}); it appears "
            "when a process first reads through gpulab.cache with this cache_dir"
        )
    uri = pathlib.Path(path).as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=rw", uri=True, timeout=60)
        conn.execute("SELECT 1 FROM meta LIMIT 1")
        return conn
    except sqlite3.OperationalError:
        # An agent running as another user may only read the cache.
        return sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60)


if __name__ == "__main__":
    # ``python -I -m gpulab.cache.index DIR``: DIR's counters as one JSON line, for a
    # sampler that reads another account's cache as that account (telemetry's
    # cache_sampler: root must not open an index its user can write).
    import json
    import sys

    _conn = open_stats_only(sys.argv[1])
    print(json.dumps(read_stats(_conn)))
