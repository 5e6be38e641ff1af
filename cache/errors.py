"""Errors the cache raises, each saying which URL and what to do."""

from __future__ import annotations


class CacheError(Exception):
    """Base class of everything the dataset cache raises on purpose."""


class UnknownProtocolError(CacheError, ValueError):
    """The URL's scheme has no fsspec implementation installed."""


class RemoteNotFoundError(CacheError, FileNotFoundError):
    """The remote store says the object does not exist."""


class RemoteReadError(CacheError, OSError):
    """The remote store failed (network, truncated body) after all retries."""
