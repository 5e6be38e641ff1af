"""Forwarding an endpoint call to a replica: the reverse proxy in front of deployments.

Connections to the replicas are kept alive (a new TCP connection per call would
cost more than the call) and bodies pass through as they are, compressed or not.
The caller's hub token never goes on: the replicas get their own secret.
"""

from __future__ import annotations

import aiohttp

#: The longest one forwarded call may take.
CALL_TIMEOUT_S = 300


class EndpointProxy:
    def __init__(self):
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=512),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
            )
        return self._session

    async def forward(
        self, urls: list[str], token: str, method: str, path: str, headers: dict, body: bytes | None
    ):
        """Send one call to the first of ``urls`` that takes it (on a refused connection,
        the next): ``(status, reason, headers, body)``, or None when none answers."""
        headers = {**headers, "Authorization": f"Bearer {token}"}
        for base in urls:
            try:
                async with self.session.request(
                    method, f"{base}/{path}", headers=headers, data=body
                ) as resp:
                    return resp.status, resp.reason, resp.headers, await resp.read()
            except aiohttp.ClientConnectionError:
                continue  # that replica just went away; try the next
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
