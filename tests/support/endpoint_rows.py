"""An endpoint as the endpoint table (and the standby's calls) hold it: one version,
its replicas' addresses ``ready`` (``[[index, address], ...]``); a stand-in replica
on a Unix socket."""

from __future__ import annotations

import contextlib


def table_row(
    ready,
    *,
    name: str = "tiny",
    token: str = "replica-secret",
    shares=(),
    groups=(),
    state: str = "running",
    message: str = "1/1 ready",
) -> dict:
    return {
        "id": "d1",
        "user": "alice",
        "name": name,
        "share_users": list(shares),
        "share_groups": list(groups),
        "state": state,
        "message": message,
        "versions": [
            {
                "id": "d1",
                "version": 1,
                "weight": 100,
                "state": state,
                "message": message,
                "max_queue": 8,
                "replicas": 1,
                "ready": ready,
                "token": token,
            }
        ],
    }


@contextlib.asynccontextmanager
async def replica_on_socket(app, path: str):
    """``app`` (an aiohttp app standing in for a replica) served on Unix socket
    ``path``; its address as the endpoint table gives it (``unix:<path>``)."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    try:
        yield f"unix:{path}"
    finally:
        await runner.cleanup()
