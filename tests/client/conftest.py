"""A real HTTP server standing in for the gpulab service, for the client's tests."""

import contextlib

import pytest
from aiohttp import web

import gpulab.client as gl


@contextlib.contextmanager
def serving(app: web.Application):
    """Serve ``app`` on a free port of 127.0.0.1 (on the client's own event loop
    thread, as the client's calls are synchronous); yields its base URL."""

    async def start():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    runner, port = gl.run_sync(start(), timeout=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        gl.run_sync(runner.cleanup(), timeout=30)


@pytest.fixture
def serve():
    return serving
