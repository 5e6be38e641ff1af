"""What a row costs the embedded engine's memory, as one owner's byte budget counts it
(``c.VectorSettings.max_mib_per_user``): its vector's bytes, its metadata's JSON, and
``PER_ITEM`` for each key and list item of the metadata.

The engine holds a row's metadata as Python objects: each key or item is about 70
bytes however short its JSON (``{"k1": 0}`` is 9 bytes of JSON), so metadata of many
small keys took about 15 times its JSON in memory, and a budget of JSON bytes alone
let one user fill the host. The service counts the rows it writes with this; the
engine counts what its collections hold with it too (after a restart, upserts,
deletes), so the two agree.
"""

from __future__ import annotations

import json

import orjson

#: Bytes counted per key or list item of a row's metadata (measured: 65 to 78 bytes
#: of Python objects per key or item, beside its JSON).
PER_ITEM = 64


def items(value, most: int | None = None) -> int:
    """Keys and list items in ``value``, nested ones too (with a stack of its own: any
    depth). Stops counting once past ``most``."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            count += len(item)
            stack.extend(item)
        if most is not None and count > most:
            break
    return count


def json_size(value) -> int:
    """Bytes of JSON: orjson's, json's for what orjson does not write (an integer past
    64 bits, a structure nested past its depth)."""
    try:
        return len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        return len(json.dumps(value, separators=(",", ":")))


def metadata_cost(metadata: dict | None) -> int:
    if not metadata:
        return 0
    return json_size(metadata) + PER_ITEM * items(metadata)


def rows_cost(dim: int, metadata: list) -> int:
    """What rows of these metadata (one each) and ``dim``-d vectors cost together."""
    return len(metadata) * dim * 4 + sum(metadata_cost(m) for m in metadata)
