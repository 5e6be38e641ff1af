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


async def test_replicas_that_never_answer_ready_do_not_hold_up_a_check(tmp_path):
    """check() runs under the deployment manager's lock, which every user's changes
    and cold starts wait for. Replicas that accept the probe's connection and never
    answer (their owner's code) cost 2 s each, one after another: 20 of them held the
    lock 40 s a pass. Now check() waits on none of them; their probes run at once, and
    the one that answers is ready as soon as it does."""
    import asyncio
    import time

    async def silent(reader, writer):
        await asyncio.sleep(3600)  # reads nothing, answers nothing

    async def ready(request):
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_get("/v2/health/ready", ready)
    serving = LocalServing(str(tmp_path / "deployments"))
    serving._token = lambda dep: "replica-token"  # noqa: SLF001 - no deployment on disk
    servers, sockets = [], {}
    for r in range(1, 20):
        path = str(tmp_path / f"r{r}.sock")
        servers.append(await asyncio.start_unix_server(silent, path))
        sockets[r] = path
    dep = {"id": "d1", "user": "alice", "name": "m", "replicas": 20}
    dep.update(restarts=0, message="starting", state="starting")
    async with replica_on_socket(app, str(tmp_path / "r0.sock")) as address:
        sockets[0] = address.removeprefix("unix:")
        # Replicas that run (a pid nobody has: the priority change finds no one).
        serving.record = lambda dep_id, r: {"pid": 2**22 + 7, "socket": sockets[r], "started": 1}
        serving.alive = lambda dep_id, r: True
        try:
            started = time.monotonic()
            health = await asyncio.wait_for(serving.check(dep), 1.0)
            assert health.ready == 0 and health.state == "starting"
            while not serving.ready_replicas(dep):  # the answering one, found on its own
                assert time.monotonic() - started < 1.5
                await asyncio.sleep(0.02)
            assert serving.ready_replicas(dep) == [(0, address)]
            health = await asyncio.wait_for(serving.check(dep), 1.0)
            assert health.ready == 1
        finally:
            await serving.close()
            for server in servers:
                server.close()


async def test_a_replica_whose_limits_cannot_be_held_fails_the_deployment(tmp_path):
    """Not started unlimited: the deployment fails, saying why, and its slices go back."""
    from gpulab.enforcement.account_limits import LimitsNotHeld

    serving = LocalServing(str(tmp_path / "deployments"))

    def refused(dep, replica, gpu_uuid=None):
        raise LimitsNotHeld("the host could not hold replica-d1-0 of gpulab-alice to its slice")

    serving.start_replica = refused
    serving.record = lambda dep_id, r: None  # admitted, never launched
    serving.alive = lambda dep_id, r: False
    dep = {"id": "d1", "user": "alice", "name": "m", "replicas": 1}
    dep.update(restarts=0, message="starting", state="starting")
    health = await serving.check(dep)
    assert health.state == "failed", health
    assert "could not hold replica-d1-0" in health.message and "slices released" in health.message
