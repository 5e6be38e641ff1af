"""The standby endpoint router's parts, without a hub: the endpoint table's file, the
call path over the table (to a real replica-like server on a Unix socket), and the
takeover of the dead service's listening socket (a real process killed with SIGKILL).

The end-to-end test on a real hub is tests/deploy/test_endpoints_survive_service_restart.py.
"""

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest
from aiohttp import web
from support.endpoint_rows import replica_on_socket, table_row

from gpulab.service.auth import Identity
from gpulab.service.endpoints.calls import CallRefused
from gpulab.service.endpoints.standby import Standby, TableCalls
from gpulab.service.endpoints.table import EndpointTable, read_table, table_path


def table_of(data_dir) -> EndpointTable:
    return EndpointTable(str(data_dir), prefix="/services/gpulab/", max_upload_mib=8)


def endpoint(ready, token="replica-secret", shares=(), groups=()):
    return table_row(ready, token=token, shares=shares, groups=groups)


def test_the_table_is_private_replaced_whole_and_written_only_on_change(tmp_path):
    table = table_of(tmp_path)
    path = table_path(str(tmp_path))
    assert table.write([endpoint([[0, "unix:/x.sock"]])])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = os.stat(path).st_ino
    assert not table.write([endpoint([[0, "unix:/x.sock"]])])  # the same: not rewritten
    assert table.write([endpoint([])])
    assert os.stat(path).st_ino != first  # a new file renamed over the old one
    assert read_table(path)["endpoints"][0]["versions"][0]["ready"] == []
    assert not os.path.exists(path + ".tmp")


@pytest.fixture
async def replica(tmp_path):
    """A replica-like server on a Unix socket: it answers only its own token."""
    seen = []

    async def infer(request):
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer replica-secret":
            return web.json_response({"error": "no"}, status=401)
        return web.json_response({"outputs": "ok"})

    app = web.Application()
    app.router.add_post("/v2/models/tiny/infer", infer)
    async with replica_on_socket(app, str(tmp_path / "replica.sock")) as address:
        yield address, seen


async def test_calls_from_the_table_follow_shares_and_reach_the_replica(replica):
    address, seen = replica
    calls = TableCalls()
    calls.load([endpoint([[0, address]], shares=["bob"], groups=["lab"])])
    alice = Identity("alice", "user")
    dep = calls.callable_endpoint(alice, "alice", "tiny")
    for who in (Identity("bob", "user"), Identity("cy", "user", groups=frozenset({"lab"}))):
        assert calls.callable_endpoint(who, "alice", "tiny") is dep
    with pytest.raises(CallRefused) as refused:
        calls.callable_endpoint(Identity("eve", "user"), "alice", "tiny")
    assert refused.value.status == 403
    status, _, _, body = await calls.call(dep, "POST", "v2/models/tiny/infer", {}, b"{}")
    assert status == 200 and b"ok" in body
    assert seen == ["Bearer replica-secret"]  # the replicas' token, never the caller's

    calls.load([endpoint([])])  # no replica ready: the service would start one
    with pytest.raises(CallRefused) as refused:
        await calls.call(dep, "POST", "v2/models/tiny/infer", {}, b"{}")
    assert refused.value.status == 503 and refused.value.retry_after
    assert "restarting" in str(refused.value)
    await calls.proxy.close()


async def test_the_standby_answers_on_the_dead_services_socket(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "unused")
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:9/hub/api")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    # The service's own route, for calls without a token: down with the service.
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", f"http://127.0.0.1:{closed.getsockname()[1]}")
    closed.close()
    table_of(tmp_path).write([endpoint([])])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stopping = asyncio.Event()
    standby = Standby(table_path(str(tmp_path)), service.pid, listener)
    running = asyncio.ensure_future(standby.run(stopping))
    try:
        # A call reaches the socket while the service lives (the kernel queues it)...
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /services/gpulab/endpoints/alice/tiny/v2/models/tiny/infer HTTP/1.1\r\n"
            b"Host: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        await writer.drain()
        # ... the service dies before it answers: the standby does.
        os.kill(service.pid, signal.SIGKILL)
        service.wait()
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 2" in head and b"restarting" in body
    finally:
        stopping.set()
        await running
        if service.poll() is None:
            service.kill()
            service.wait()
