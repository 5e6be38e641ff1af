"""The embedded engine's write-ahead log: every write is in it, on disk, before the
engine answers, so a kill -9 (or a power cut: it is fsynced) loses no acknowledged row.

A record is ``[length u32][crc32 u32][header length u32][JSON header][float32 bytes]``;
the header holds the record's sequence number, its operation and its rows' ids and
metadata, the bytes their vectors. Reading stops at the first record that is cut
short or does not match its checksum (the write a crash interrupted, never
acknowledged) and the file is cut there, so the next record follows a whole one.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator

import numpy as np

HEAD = struct.Struct("<III")


def encode(header: dict, vectors: np.ndarray | None) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + (b"" if vectors is None else np.ascontiguousarray(vectors, "<f4").tobytes())
    return HEAD.pack(len(body), zlib.crc32(body), len(head)) + body


def decode(body: bytes, head_len: int, dim: int) -> tuple[dict, np.ndarray | None]:
    header = json.loads(body[:head_len])
    raw = body[head_len:]
    vectors = np.frombuffer(raw, dtype="<f4").reshape(-1, dim) if raw else None
    return header, vectors


class LogBroken(OSError):
    """A failed append could not be taken back: the log takes no more writes."""


class Log:
    """One collection's log file, appended to and fsynced per write."""

    def __init__(self, path: str):
        self.path = path
        made = not os.path.exists(path)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size
        if made:  # its name on disk before any write in it is answered (a power cut)
            fsync_dir(os.path.dirname(path) or ".")
        #: Why the log takes no more writes (a failed append it could not cut off).
        self.broken: str | None = None

    def append(self, header: dict, vectors: np.ndarray | None) -> None:
        """The record on disk, fsynced; if anything fails, the file is as before.

        A failed append that stayed in the file would break the log either way: cut
        short (a full disk), replay stops at it and cuts off every acknowledged record
        after it; whole but not synced, the caller was told it failed, yet replay
        applies it, and the next write reuses its sequence number and is skipped."""
        if self.broken is not None:
            raise LogBroken(self.broken)
        record = encode(header, vectors)
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(self.fd, view) :]
            os.fdatasync(self.fd)
        except BaseException as failed:
            self._take_back(failed)
            raise
        self.size += len(record)

    def _take_back(self, failed: BaseException) -> None:
        """Cut the file back to its last whole record, or refuse further writes."""
        try:
            os.ftruncate(self.fd, self.size)
            os.fdatasync(self.fd)
        except OSError as e:
            self.broken = (
                f"{self.path}: a write failed ({failed}) and could not be cut off the log "
                f"({e}); it takes no more writes until the vector engine restarts"
            )

    def close(self) -> None:
        os.close(self.fd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replay(path: str, dim: int) -> Iterator[tuple[dict, np.ndarray | None]]:
    """The whole records of ``path`` in order; a torn tail is cut off the file."""
    good = 0
    with open(path, "rb") as f:
        data = f.read()
    while good + HEAD.size <= len(data):
        length, crc, head_len = HEAD.unpack_from(data, good)
        start = good + HEAD.size
        body = data[start : start + length]
        if len(body) != length or zlib.crc32(body) != crc or head_len > length:
            break
        yield decode(body, head_len, dim)
        good = start + length
    if good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fsync(f.fileno())
