"""Where the node-local cache lives and how big it may grow.

Both come from the environment so that every process on a node (notebook
kernels, training ranks, DataLoader workers, the telemetry agent) agrees on
them without passing arguments around: an administrator sets them once in the
spawner's environment.
"""

from __future__ import annotations

import os
import re

CACHE_DIR_ENV = "GPULAB_CACHE_DIR"
CAPACITY_ENV = "GPULAB_CACHE_CAPACITY_BYTES"

DEFAULT_CAPACITY_BYTES = 20 * 2**30
"""20 GiB: a few epochs of a mid-sized dataset on a node's scratch disk."""

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
    "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


def default_cache_dir() -> str:
    """``$GPULAB_CACHE_DIR``, else ``~/.cache/gpulab/datasets``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".cache", "gpulab", "datasets")


def parse_size(text: str | int) -> int:
    """Bytes from ``"20GiB"``, ``"500MB"``, ``"1073741824"`` or an int."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise ValueError(
                f"cannot read {text!r} as a size in bytes; write a number with "
                "an optional unit, e.g. 20GiB, 500MB or 1073741824")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a cache capacity must be positive, got {text!r}")
    return value


def default_capacity_bytes() -> int:
    """``$GPULAB_CACHE_CAPACITY_BYTES`` (units allowed), else 20 GiB."""
    configured = os.environ.get(CAPACITY_ENV)
    if not configured:
        return DEFAULT_CAPACITY_BYTES
    try:
        return parse_size(configured)
    except ValueError as err:
        raise ValueError(f"{CAPACITY_ENV}: {err}") from None
