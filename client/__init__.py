"""Python client of the gpulab service (async inside, sync face for notebooks).

What it raises lives in :mod:`gpulab.client.errors` (every one a
:class:`GpuLabError`); job and deployment states in :mod:`gpulab.client.states`.
Both are standard library only; the client itself (aiohttp) is imported on first
use, so ``%load_ext gpulab.magics`` stays quick.
"""

from .errors import (
    AuthenticationError,
    BadRequest,
    ConfigurationError,
    Conflict,
    GpuLabError,
    NotFound,
    PermissionDenied,
    RequestRefused,
    ServiceUnreachable,
)
from .states import DEPLOYMENT_STATES, DEPLOYMENT_UNHEALTHY, JOB_ACTIVE, JOB_STATES, JOB_TERMINAL

_LAZY = ("AsyncClient", "Client", "run_sync")


def __getattr__(name: str):
    if name in _LAZY:
        from . import base

        return getattr(base, name)
    if name == "Endpoint":
        from .endpoint import Endpoint

        return Endpoint
    if name == "chunk_text":
        from .chunking import chunk_text

        return chunk_text
    if name in ("Collection", "Hit"):
        from . import collections

        return getattr(collections, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEPLOYMENT_STATES",
    "DEPLOYMENT_UNHEALTHY",
    "JOB_ACTIVE",
    "JOB_STATES",
    "JOB_TERMINAL",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Collection",
    "ConfigurationError",
    "Endpoint",
    "Conflict",
    "GpuLabError",
    "Hit",
    "NotFound",
    "PermissionDenied",
    "RequestRefused",
    "ServiceUnreachable",
    "run_sync",
]
