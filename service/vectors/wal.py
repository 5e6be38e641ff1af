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


class Log:
    """One collection's log file, appended to and fsynced per write."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size

    def append(self, header: dict, vectors: np.ndarray | None) -> None:
        record = encode(header, vectors)
        view = memoryview(record)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fdatasync(self.fd)
        self.size += len(record)

    def close(self) -> None:
        os.close(self.fd)


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
