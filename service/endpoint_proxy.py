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
                # No cookies kept between callers.
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def forward(
        self, base: str, token: str, method: str, path: str, headers: dict, body: bytes | None
    ):
        """Send one call to the replica at ``base``: ``(status, reason, headers, body)``,
        or None when it refuses the connection (it just went away)."""
        headers = {**headers, "Authorization": f"Bearer {token}"}
        try:
            async with self.session.request(
                method, f"{base}/{path}", headers=headers, data=body
            ) as resp:
                return resp.status, resp.reason, resp.headers, await resp.read()
        except aiohttp.ClientConnectionError:
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
