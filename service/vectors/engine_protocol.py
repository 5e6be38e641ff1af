"""The messages between the service and its embedded engine (:mod:`.engine_server`),
on a Unix socket (:mod:`.engine_transport`): ``[header length u32][JSON header][float32
vectors]``.

No pickle: the engine runs under another account, and neither side runs what the
other sends. A reply's header holds ``error`` and ``status`` when the call failed.
"""

from __future__ import annotations

import json
import struct

import numpy as np

METHODS = (
    "create",
    "drop",
    "names",
    "write",
    "existing",
    "delete",
    "count",
    "flush",
    "search",
    "ping",
)
LENGTH = struct.Struct("<I")
#: Messages up to this size (a 1,000-row batch of 4,096-d vectors is 16 MB).
MAX_MESSAGE = 64 * 2**20


def pack(header: dict, vectors: np.ndarray | None = None) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    tail = b"" if vectors is None else np.ascontiguousarray(vectors, "<f4").tobytes()
    return LENGTH.pack(len(head)) + head + tail


def unpack(message: bytes) -> tuple[dict, np.ndarray | None]:
    (n,) = LENGTH.unpack_from(message)
    header = json.loads(message[LENGTH.size : LENGTH.size + n])
    raw = message[LENGTH.size + n :]
    vectors = None
    if raw:
        vectors = np.frombuffer(raw, dtype="<f4").reshape(-1, header["dim"])
    return header, vectors
