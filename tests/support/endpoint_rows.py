"""An endpoint as the endpoint table (and the standby's calls) hold it: one version,
its replicas' addresses ``ready`` (``[[index, address], ...]``)."""

from __future__ import annotations


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
