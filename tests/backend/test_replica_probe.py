"""The service's readiness probe of a local replica reads what it needs: a replica runs
its owner's code, and a few KiB of gzip it answers would unpack to GiBs in the service
(root, every user's work)."""

from __future__ import annotations

import gzip

from aiohttp import web
from support.endpoint_rows import replica_on_socket

from gpulab.backend.local_serving import PROBE_READ_BYTES, LocalServing


async def test_a_replicas_gzip_of_zeros_is_not_unpacked_by_the_probe(tmp_path):
    packed = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in about 64 KiB

    async def ready(request):
        return web.Response(body=packed, headers={"Content-Encoding": "gzip"})

    app = web.Application()
    app.router.add_get("/v2/health/ready", ready)
    serving = LocalServing(str(tmp_path / "deployments"))
    serving._token = lambda dep: "replica-token"  # noqa: SLF001 - no deployment on disk
    async with replica_on_socket(app, str(tmp_path / "replica.sock")) as address:
        try:
            status, body = await serving._get({"id": "d1"}, address, "/v2/health/ready")  # noqa: SLF001
        finally:
            await serving._sessions.close()  # noqa: SLF001
    assert status == 200  # ready is read from the status alone
    assert len(body) <= PROBE_READ_BYTES and body == packed[: len(body)]
