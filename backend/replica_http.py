"""HTTP to replicas at their addresses: ``unix:<socket path>`` or a base URL.

Local replicas listen on Unix sockets (:mod:`.replica_sockets`); a Kubernetes
Service is a URL (``http://...``). aiohttp speaks HTTP over a Unix socket through a
connector of that socket's own, so :class:`ReplicaSessions` keeps a client session
per socket (and one for every URL), made on first use with its owner's options:
the endpoint router's forwarding and the readiness probes each keep theirs.

Sessions to ``https://`` URLs (replicas behind a Kubernetes Service when TLS is on)
verify the replica's certificate against the system's CAs and, when
``GPULAB_CA_FILE`` names a PEM file, its CAs too: the cluster's own CA that signed
the replicas' certificate. Calls over a Unix socket stay plain HTTP: the socket lies
in a folder only the service's account can enter, so no network carries them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable

import aiohttp

from gpulab.client.tls import client_context

#: The address of a replica that listens on a Unix socket: ``unix:/run/...sock``.
UNIX = "unix:"
#: The host name calls over a Unix socket carry (the socket, not it, says where).
UNIX_URL = "http://localhost"
#: Sessions kept before those of sockets that no longer exist are closed.
PRUNE_AT = 64


def unix_address(path: str) -> str:
    return UNIX + path


def socket_path(address: str) -> str | None:
    """The socket path of a ``unix:`` address; None for a URL."""
    return address[len(UNIX) :] if address.startswith(UNIX) else None


class ReplicaSessions:
    """``make(connector) -> ClientSession`` for each socket, and one for all URLs."""

    def __init__(self, make: Callable[[aiohttp.BaseConnector], aiohttp.ClientSession], limit=100):
        self.make = make
        self.limit = limit  # connections at once, per socket (and for all URLs together)
        self._sessions: dict[str | None, aiohttp.ClientSession] = {}
        self._tls: ssl.SSLContext | None = None  # made with the first URL's session

    async def get(self, address: str) -> tuple[aiohttp.ClientSession, str]:
        """The session for ``address`` and the base URL to put before a path."""
        path = socket_path(address)
        session = self._sessions.get(path)
        if session is None or session.closed:
            if len(self._sessions) >= PRUNE_AT:
                await self._prune()
            if path is None:
                if self._tls is None:
                    self._tls = client_context()
                connector = aiohttp.TCPConnector(limit=self.limit, ssl=self._tls)
            else:
                connector = aiohttp.UnixConnector(path, limit=self.limit)
            session = self._sessions[path] = self.make(connector)
        return session, (UNIX_URL if path is not None else address.rstrip("/"))

    async def _prune(self) -> None:
        # Replicas scaled away or deleted leave no socket file behind: their sessions go.
        for path in [p for p in self._sessions if p is not None and not os.path.exists(p)]:
            await self._sessions.pop(path).close()

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()
