"""The gpulab service's Python client: async inside, a sync face for notebooks.

Inside a server gpulab spawned, it needs no arguments: ``GPULAB_API_URL`` and
``JUPYTERHUB_API_TOKEN`` are in the environment. Elsewhere pass both::

    from gpulab.client import Client
    gl = Client("https://hub.example.org/services/gpulab/api/v1", token="...")
    gl.allocations()

The sync methods run the async ones on one background event loop thread, so
they work inside Jupyter (whose own loop is already running).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp

from .alerts import AlertsAPI
from .budget import BudgetAPI
from .collections import CollectionsAPI
from .deployments import DeploymentsMixin
from .errors import ConfigurationError, ServiceUnreachable, refused
from .hibernations import HibernationsAPI
from .jobs import JobsMixin
from .telemetry import TelemetryAPI
from .tls import client_context
from .usage import UsageAPI

#: What aiohttp raises when no (whole) answer came: the client raises ServiceUnreachable.
_NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError)


class _LoopThread:
    """One event loop on a daemon thread, shared by every sync call."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=cls._loop.run_forever, name="gpulab-client", daemon=True
                ).start()
            return cls._loop


def client_loop() -> asyncio.AbstractEventLoop:
    """The client's event loop (on its daemon thread), for streams followed in the background."""
    return _LoopThread.loop()


def run_sync(coro, timeout: float | None = None):
    """Run ``coro`` on the client's loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _LoopThread.loop()).result(timeout)


class AsyncClient(
    JobsMixin,
    DeploymentsMixin,
    TelemetryAPI,
    UsageAPI,
    BudgetAPI,
    AlertsAPI,
    HibernationsAPI,
    CollectionsAPI,
):
    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        ca_file: str | None = None,
    ):
        # What was given, not what the environment gave: a client saved by a
        # hibernation comes back with the environment of the server it wakes in (a
        # server's token changes every start).
        self._given = (api_url, token, timeout, ca_file)
        self.api_url = (api_url or os.environ.get("GPULAB_API_URL") or "").rstrip("/")
        self._token = token or os.environ.get("JUPYTERHUB_API_TOKEN") or ""
        if not self.api_url:
            raise ConfigurationError(
                0,
                "no gpulab API address: set GPULAB_API_URL "
                "(gpulab sets it in the servers it starts) or pass api_url=",
            )
        if not self._token:
            raise ConfigurationError(0, "no token: set JUPYTERHUB_API_TOKEN or pass token=")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        # https: the system's CAs, GPULAB_CA_FILE's (gpulab up --tls self-signed) and ca_file.
        self._ca_files = [ca_file] if ca_file else []
        self._ssl: ssl.SSLContext | None = None

    def __reduce__(self):
        # Its TLS context cannot be pickled, and an address or token it read from the
        # environment belongs to the server it ran in: rebuilt from what was given.
        return (type(self), self._given)

    def _session(self, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        if not self.api_url.startswith("https:"):
            return aiohttp.ClientSession(timeout=timeout)
        if self._ssl is None:
            try:
                self._ssl = client_context(self._ca_files)
            except OSError as e:
                raise ConfigurationError(0, str(e)) from None
        return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=self._ssl))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}"}

    def url(self, path: str, query: dict | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return f"{self.api_url}{path}" + (f"?{urlencode(q)}" if q else "")

    def unreachable(self, err: BaseException) -> ServiceUnreachable:
        detail = str(err) or type(err).__name__
        return ServiceUnreachable(
            0, f"no answer from the gpulab service at {self.api_url}: {detail}"
        )

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict | None = None,
        form: aiohttp.FormData | None = None,
    ) -> Any:
        """One call; ``body`` is sent as JSON, or ``form`` as multipart/form-data."""
        try:
            async with (
                self._session(self.timeout) as s,
                s.request(
                    method,
                    self.url(path, query),
                    headers=self.headers,
                    json=body if form is None else None,
                    data=form,
                ) as r,
            ):
                data = await r.read()
                if r.status >= 400:
                    raise refused(r.status, _error_message(data, r.reason))
        except _NO_ANSWER as e:
            raise self.unreachable(e) from e
        return json.loads(data) if data else None

    async def read_bytes(self, path: str, query: dict | None = None) -> bytes:
        """A GET whose answer is not JSON (pickled output, log text)."""
        try:
            async with (
                self._session(self.timeout) as s,
                s.get(self.url(path, query), headers=self.headers) as r,
            ):
                data = await r.read()
                if r.status >= 400:
                    raise refused(r.status, _error_message(data, r.reason))
                return data
        except _NO_ANSWER as e:
            raise self.unreachable(e) from e

    async def stream_lines(self, path: str, query: dict | None = None) -> AsyncIterator[str]:
        """Lines of a streaming response (logs with follow), as they arrive."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        try:
            async with (
                self._session(timeout) as s,
                s.get(self.url(path, query), headers=self.headers) as r,
            ):
                if r.status >= 400:
                    raise refused(r.status, _error_message(await r.read(), r.reason))
                async for raw in r.content:
                    yield raw.decode(errors="replace").rstrip("\n")
        except _NO_ANSWER as e:
            raise self.unreachable(e) from e

    async def call_endpoint(self, endpoint_path: str, path: str, body: bytes) -> dict:
        """POST a JSON body to ``path`` under an endpoint (``GET /models``' ``path``)."""
        url = self.endpoint_url({"path": endpoint_path}) + "/" + path
        headers = {**self.headers, "Content-Type": "application/json"}
        try:
            async with (
                self._session(self.timeout) as s,
                s.post(url, data=body, headers=headers) as r,
            ):
                data = await r.read()
                if r.status >= 400:
                    raise refused(r.status, _error_message(data, r.reason))
        except _NO_ANSWER as e:
            raise self.unreachable(e) from e
        return json.loads(data)

    async def inventory(self) -> dict:
        return await self.request("GET", "/inventory")

    async def allocations(self, user: str | None = None) -> list[dict]:
        return await self.request("GET", "/allocations", query={"user": user})

    async def availability(self) -> dict:
        return await self.request("GET", "/availability")

    async def pools(self) -> dict:
        """The site's pools in the order ``auto`` tries them, with their free slices."""
        return await self.request("GET", "/pools")


def _error_message(data: bytes, reason: str | None) -> str:
    """The service's ``{"error": ...}``, else the start of whatever it answered."""
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data[:500].decode(errors="replace") or reason or "error"


class Client:
    """Sync face of :class:`AsyncClient`: same methods, blocking."""

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        ca_file: str | None = None,
    ):
        self.aio = AsyncClient(api_url, token, timeout, ca_file)

    def __reduce__(self):
        # Saved (a hibernation, pickle) as what it was made with; see AsyncClient.
        return (type(self), self.aio._given)

    def __getattr__(self, name: str):
        if name == "aio" or name.startswith("__"):
            # Not there yet (a copy being built): asking aio would ask this again.
            raise AttributeError(name)
        attr = getattr(self.aio, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args, **kwargs):
            return run_sync(attr(*args, **kwargs))

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call
