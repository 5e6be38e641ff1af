"""Where the node-local cache lives and how big it may grow.

Both come from the environment so that every process on a node (notebook
kernels, training ranks, DataLoader workers, the telemetry agent) agrees on
them without passing arguments around: an administrator sets them once in the
spawner's environment.
"""

from __future__ import annotations

import os

from gpulab.training.sizes import parse_size as parse_bytes

CACHE_DIR_ENV = "GPULAB_CACHE_DIR"
CAPACITY_ENV = "GPULAB_CACHE_CAPACITY_BYTES"

DEFAULT_CAPACITY_BYTES = 20 * 2**30
"""20 GiB: a few epochs of a mid-sized dataset on a node's scratch disk."""


def default_cache_dir() -> str:
    """``$GPULAB_CACHE_DIR``, else ``~/.cache/gpulab/datasets``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".cache", "gpulab", "datasets")


def parse_size(text: str | int) -> int:
    """A cache capacity in bytes from ``"20GiB"``, ``"500GB"``, ``"1073741824"`` or an int.

    gpulab's one size rule (:mod:`gpulab.training.sizes`): ``K``/``M``/``G``/``T``
    alone and ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024, ``KB``/``MB``/
    ``GB``/``TB`` powers of 1000.
    """
    value = parse_bytes(text)
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
