"""What the client raises, against a real HTTP server (aiohttp) and a closed port."""

import pickle
import socket

import pytest
from aiohttp import web

from gpulab import client as gl
from gpulab.client import errors


def test_every_error_is_a_gpulab_error_and_exported():
    for name in errors.__all__:
        if name != "refused":
            cls = getattr(errors, name)
            assert issubclass(cls, gl.GpuLabError) and getattr(gl, name) is cls


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, gl.BadRequest),
        (401, gl.AuthenticationError),
        (403, gl.PermissionDenied),
        (404, gl.NotFound),
        (409, gl.Conflict),
        (413, gl.RequestRefused),
        (500, gl.RequestRefused),
    ],
)
def test_refused_picks_the_class_by_status(status, cls):
    err = errors.refused(status, "why")
    assert type(err) is cls and err.status == status and str(err) == "why" == err.message
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls and again.status == status and str(again) == "why"


def test_no_address_or_token_is_a_configuration_error(monkeypatch):
    monkeypatch.delenv("GPULAB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    with pytest.raises(gl.ConfigurationError, match="GPULAB_API_URL") as info:
        gl.Client(token="t")
    assert info.value.status == 0
    with pytest.raises(gl.ConfigurationError, match="JUPYTERHUB_API_TOKEN"):
        gl.Client("http://127.0.0.1:1/api")


@pytest.fixture
def service(serve):
    """A real HTTP server answering like the gpulab service does."""

    async def refuse(request):
        status = int(request.match_info["status"])
        return web.json_response({"error": f"refused with {status}"}, status=status)

    async def plain(request):
        return web.Response(status=502, text="bad gateway from a proxy")

    async def ok(request):
        return web.json_response({"nodes": []})

    async def out(request):
        return web.Response(body=b"\x80\x05pickled")

    app = web.Application()
    app.router.add_get("/api/inventory", ok)
    app.router.add_get("/api/jobs/j1/out", out)
    app.router.add_get("/api/plain", plain)
    app.router.add_route("*", "/api/refuse/{status}", refuse)

    with serve(app) as url:
        yield f"{url}/api"


def test_error_answers_raise_by_status(service):
    c = gl.Client(service, token="t")
    assert c.inventory() == {"nodes": []}
    assert c.job_output("j1") == b"\x80\x05pickled"
    for status, cls in ((400, gl.BadRequest), (403, gl.PermissionDenied), (409, gl.Conflict)):
        with pytest.raises(cls, match=f"refused with {status}") as info:
            gl.run_sync(c.aio.request("POST", f"/refuse/{status}", body={}), timeout=30)
        assert info.value.status == status
    with pytest.raises(gl.RequestRefused, match="bad gateway") as info:
        gl.run_sync(c.aio.request("GET", "/plain"), timeout=30)
    assert info.value.status == 502
    with pytest.raises(gl.NotFound):
        c.get_job("nope")


def test_no_answer_is_service_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    c = gl.Client(f"http://127.0.0.1:{port}/api", token="t", timeout=10)
    with pytest.raises(gl.ServiceUnreachable, match=f"127.0.0.1:{port}") as info:
        c.inventory()
    assert info.value.status == 0
    with pytest.raises(gl.ServiceUnreachable):
        gl.run_sync(c.aio.job_logs("j1"), timeout=30)
