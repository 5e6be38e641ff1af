"""Helpers shared by the cache tests (a module: conftest is not importable by name)."""

SHARD_BYTES = 64 * 1024


def remote_bytes(shards, name) -> bytes:
    directory, _ = shards
    return (directory / name).read_bytes()
