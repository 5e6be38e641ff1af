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
import threading
from typing import Any, AsyncIterator
from urllib.parse import urlencode

import aiohttp

from .deployments import DeploymentsMixin
from .jobs import JobsMixin
from .telemetry import TelemetryAPI


class GpuLabError(Exception):
    """The service refused a request; ``str()`` is its message, ``status`` the code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _LoopThread:
    """One event loop on a daemon thread, shared by every sync call."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="gpulab-client",
                                 daemon=True).start()
            return cls._loop


def run_sync(coro, timeout: float | None = None):
    """Run ``coro`` on the client's loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _LoopThread.loop()).result(timeout)


class AsyncClient(JobsMixin, DeploymentsMixin, TelemetryAPI):
    def __init__(self, api_url: str | None = None, token: str | None = None,
                 timeout: float = 60.0):
        self.api_url = (api_url or os.environ.get("GPULAB_API_URL") or "").rstrip("/")
        self._token = token or os.environ.get("JUPYTERHUB_API_TOKEN") or ""
        if not self.api_url:
            raise GpuLabError(0, "no gpulab API address: set GPULAB_API_URL "
                                 "(gpulab sets it in the servers it starts) or pass api_url=")
        if not self._token:
            raise GpuLabError(0, "no token: set JUPYTERHUB_API_TOKEN or pass token=")
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}"}

    def url(self, path: str, query: dict | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return f"{self.api_url}{path}" + (f"?{urlencode(q)}" if q else "")

    async def request(self, method: str, path: str, body: Any = None,
                      query: dict | None = None, form: aiohttp.FormData | None = None) -> Any:
        """One call; ``body`` is sent as JSON, or ``form`` as multipart/form-data."""
        async with aiohttp.ClientSession(timeout=self.timeout) as s:
            async with s.request(method, self.url(path, query), headers=self.headers,
                                 json=body if form is None else None, data=form) as r:
                text = await r.text()
                if r.status >= 400:
                    try:
                        message = json.loads(text)["error"]
                    except (ValueError, KeyError, TypeError):
                        message = text[:500] or r.reason
                    raise GpuLabError(r.status, message)
                return json.loads(text) if text else None

    async def stream_lines(self, path: str, query: dict | None = None) -> AsyncIterator[str]:
        """Lines of a streaming response (logs with follow), as they arrive."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async with s.get(self.url(path, query), headers=self.headers) as r:
                if r.status >= 400:
                    raise GpuLabError(r.status, (await r.text())[:500])
                async for raw in r.content:
                    yield raw.decode(errors="replace").rstrip("\n")

    async def inventory(self) -> dict:
        return await self.request("GET", "/inventory")

    async def allocations(self, user: str | None = None) -> list[dict]:
        return await self.request("GET", "/allocations", query={"user": user})

    async def availability(self) -> dict:
        return await self.request("GET", "/availability")


class Client:
    """Sync face of :class:`AsyncClient`: same methods, blocking."""

    def __init__(self, api_url: str | None = None, token: str | None = None,
                 timeout: float = 60.0):
        self.aio = AsyncClient(api_url, token, timeout)

    def __getattr__(self, name: str):
        attr = getattr(self.aio, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args, **kwargs):
            return run_sync(attr(*args, **kwargs))

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call
