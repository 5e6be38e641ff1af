"""The endpoint table: what a call needs to know, in a file the standby router reads.

The service writes it (:class:`EndpointTable`, from the deployment loop) whenever it
changes, so the standby router (:mod:`gpulab.service.endpoints.standby`) can answer endpoint calls
while the service itself is down: every endpoint's owner, name and shares, its
versions with their weights, and each version's ready replicas with the replicas'
own token. Those tokens are why the file is private to the service's account
(0600, written beside the database and replaced in one rename, so a reader never
sees half of it).
"""

from __future__ import annotations

import json
import os

#: The file, in the service's data dir.
TABLE_NAME = "endpoint-table.json"
#: The fields of a deployment row and of a version row that a call reads.
DEPLOYMENT_FIELDS = ("id", "user", "name", "share_users", "share_groups", "state", "message")
VERSION_FIELDS = ("id", "version", "weight", "state", "message", "max_queue", "replicas")


def table_path(data_dir: str) -> str:
    return os.path.join(data_dir, TABLE_NAME)


def write_private(path: str, text: str) -> None:
    """``text`` to ``path``, readable by this account only, replaced atomically."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file of another mode is truncated, not recreated
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_table(path: str) -> dict:
    """The table as written; OSError or ValueError when there is none (yet)."""
    with open(path) as f:
        return json.load(f)


class EndpointTable:
    """The service's side: the table's file, rewritten only when it changed."""

    def __init__(self, data_dir: str, prefix: str, max_upload_mib: int):
        self.path = table_path(data_dir)
        # What the standby's router needs of the service besides the endpoints.
        self.head = {"prefix": prefix, "max_upload_mib": max_upload_mib}
        self._written: str | None = None

    def write(self, endpoints: list[dict]) -> bool:
        """Write the table of ``endpoints`` (:meth:`~gpulab.service.endpoints.calls.CallsMixin.
        endpoint_table`) if it differs from the last one written; whether it did."""
        text = json.dumps({**self.head, "endpoints": endpoints}, sort_keys=True)
        if text == self._written:
            return False
        write_private(self.path, text)
        self._written = text
        return True
