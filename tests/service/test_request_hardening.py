"""Bad requests get the answer HTTP and the docs promise (issue 24's Low findings),
on the real service in-process (a stand-in hub API, :mod:`support.service`): 405s
say what is allowed, an oversized chunked body is a JSON 413, an empty ``since=``,
a denormal number and a key given twice are 400s that say so.

Also here, without a hub: which series of ``/metrics`` a caller who may not see
every job reads, and whose socket a loopback connection is (the audit source).
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from support.service import listen, running_service

from gpulab.enforcement.peer_account import platform_peer
from gpulab.service.api.request_body import JSON_BODY_LIMIT
from gpulab.service.operations.audit import client_source


@pytest.fixture
async def svc(tmp_path):
    async with running_service(tmp_path / "svc") as service:
        yield service


def error_of(r) -> str:
    return r.json()["error"]


async def test_a_405_says_which_methods_the_route_answers(svc):
    r = await svc.request("PUT", "/allocations")
    assert r.status_code == 405
    assert r.headers["Allow"] == "GET, POST, DELETE"
    assert "error" in r.json()
    r = await svc.request("POST", "/inventory")
    assert r.status_code == 405 and r.headers["Allow"] == "GET"


async def test_a_chunked_body_over_the_limit_is_a_json_413(svc):
    def chunks():  # no Content-Length: requests sends it chunked
        for _ in range(2 * JSON_BODY_LIMIT // 65536 + 1):
            yield b" " * 65536

    r = await svc.request(
        "POST", "/allocations", data=chunks(), headers_extra={"Content-Type": "application/json"}
    )
    assert r.status_code == 413, (r.status_code, r.text[:200])
    assert "is larger than the 1 MiB this route takes" in error_of(r)
    # Under the limit, chunked is read as usual.
    small = iter([b'{"user": "a", "owner_kind": "server",', b' "owner": "a/", "gpu_milli": 250}'])
    r = await svc.request("POST", "/allocations", data=small)
    assert r.status_code == 201, r.text


async def test_one_callers_bodies_in_memory_at_once_are_bounded(svc, monkeypatch):
    """A job's body (up to 341 MiB of base64) takes about three times its size while
    the service parses it: eight sent at once took all its memory. Past the bytes one
    caller may send at once, another body is a 429; other callers are not held up,
    and the room comes back when the caller's request ends (here: it hangs up)."""
    import asyncio
    import base64
    from urllib.parse import urlsplit

    from gpulab.service.api import request_body

    monkeypatch.setattr(request_body, "BODY_BYTES_PER_CALLER", 8 << 20)
    alice, bob = svc.create_user("alice"), svc.create_user("bob")
    # alice starts a 6 MiB job body and sends only its first bytes.
    url = urlsplit(svc.api)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        (
            f"POST {url.path}/jobs HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: token {alice}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {6 << 20}\r\n\r\n"
        ).encode()
        + b'{"code": "print(1)", "vars_b64": "'
    )
    await writer.drain()
    await asyncio.sleep(0.5)  # its headers read, its room held
    # A 3 MiB body the job intake reads, then refuses (a 400): no job runs here.
    variables = base64.b64encode(b"x" * (3 << 20)).decode()
    job = {"code": "print(1)", "gpu_milli": -250, "vars_b64": variables}
    r = await svc.request("POST", "/jobs", token=alice, json=job)
    assert r.status_code == 429, r.text
    assert "you are already sending 6 MiB of request bodies to gpulab" in error_of(r)
    assert "wait for those to be answered, then send it again" in error_of(r)
    r = await svc.request("POST", "/jobs", token=bob, json=job)
    assert r.status_code == 400, r.text  # bob's room is his own
    writer.close()
    await writer.wait_closed()
    for _ in range(50):  # the service sees the hang-up on its next read
        r = await svc.request("POST", "/jobs", token=alice, json=job)
        if r.status_code != 429:
            break
        await asyncio.sleep(0.1)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "path",
    ["/usage?since=", "/usage?until=", "/audit?since=", "/alerts?since=", "/telemetry?since="],
)
async def test_an_empty_time_is_refused_with_the_format(svc, path):
    r = await svc.request("GET", path)
    assert r.status_code == 400, (path, r.status_code, r.text)
    assert "since" in error_of(r) or "until" in error_of(r)
    assert "Unix seconds" in error_of(r) or "unix seconds" in error_of(r)


async def test_a_chunked_model_upload_over_the_cap_is_a_413_that_says_the_cap(tmp_path):
    """A chunked upload says its size only as it comes: the service reads it to the cap
    and past it (dropping the rest), then answers 413; hanging up at the cap made the
    hub's proxy answer its own 503 page instead."""
    async with running_service(
        tmp_path / "svc", config="c.GpuLabService.max_upload_mib = 1\n"
    ) as s:
        alice = s.create_user("alice")
        boundary = "gpulab-test-boundary"

        def body():  # no Content-Length: requests sends it chunked
            yield (
                f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\n\r\n'
                f'{{"name": "big"}}\r\n--{boundary}\r\nContent-Disposition: form-data; '
                f'name="model"; filename="model.tar"\r\n\r\n'
            ).encode()
            for _ in range(3 * 16):  # 3 MiB of model: over the 1 MiB cap
                yield b"\0" * 65536
            yield f"\r\n--{boundary}--\r\n".encode()

        r = await s.request(
            "POST",
            "/deployments",
            token=alice,
            data=body(),
            headers_extra={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert r.status_code == 413, (r.status_code, r.text[:200])
        assert "over 1 MiB" in error_of(r) and "max_upload_mib" in error_of(r)
        spool = s.data_dir / "uploads"
        assert not spool.exists() or not any(spool.iterdir())  # nothing of it kept


@pytest.mark.parametrize(
    "path, name",
    [
        ("/audit?before=769943294379313332224", "before"),
        ("/audit?before=9223372036854775808", "before"),
        ("/audit?limit=99999999999999999999999", "limit"),
        ("/audit?since=1e20", "since"),
        ("/usage?until=0001-01-01", "until"),
        ("/usage?since=-99999999999", "since"),
        ("/alerts?since=9999-12-31T23:00-05:00", "since"),
    ],
)
async def test_a_number_or_time_out_of_range_is_a_400_that_says_the_range(svc, path, name):
    r = await svc.request("GET", path)
    assert r.status_code == 400, (path, r.status_code, r.text)
    message = error_of(r)
    assert "\n" not in message and name in message
    assert " from " in message, message  # the range it takes


async def test_the_largest_stored_integer_still_pages_the_audit(svc):
    r = await svc.request("GET", "/audit?before=9223372036854775807")
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("number", ["1e-320", "-4.9e-324", "1e-400", "2.5e-310"])
async def test_a_denormal_or_vanishing_number_is_refused_with_the_range(svc, number):
    alice = svc.create_user("alice")
    body = f'{{"code": "print(1)", "timeout": {number}}}'.encode()
    r = await svc.raw("POST", "/jobs", alice, body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert number in error_of(r) and "between 2.23e-308 and 1.8e+308" in error_of(r)


async def test_ordinary_numbers_still_pass(svc):
    alice = svc.create_user("alice")
    r = await svc.raw("POST", "/jobs", alice, b'{"code": "print(1)", "timeout": 1e-3, "x": 0.0}')
    assert r.status_code == 400 and "unknown" in error_of(r).lower() and "x" in error_of(r)


@pytest.mark.parametrize(
    "body, key",
    [
        (b'{"code": "print(1)", "code": "import os"}', "code"),
        (b'{"code": "print(1)", "env": {"A": "1", "A": "2"}}', "A"),
    ],
)
async def test_a_key_given_twice_is_refused_by_name(svc, body, key):
    alice = svc.create_user("alice")
    r = await svc.raw("POST", "/jobs", alice, body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert f"the key {key!r} appears twice" in error_of(r)


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"vector": [0.5, 1e-320, 0.25]}', "1e-320 is too small"),
        (b'{"vector": [0.5, 1e-400]}', "1e-400 is too small"),
        (b'{"vector": [0.5, 1e400]}', "1e400 is out of range"),
        (b'{"rows": [{"id": "a"}, {"id": "b", "id": "c"}]}', "the key 'id' appears twice"),
    ],
)
def test_numbers_and_keys_in_long_lists_are_checked_as_anywhere(body, says):
    """Bodies are read by orjson where that reads what the checked parser would (a
    search's vector: most of its time in the service); these it must not."""
    from tornado import web

    from gpulab.service.api.request_body import parse_json_object

    with pytest.raises(web.HTTPError) as refused:
        parse_json_object(body)
    assert refused.value.status_code == 400 and says in refused.value.log_message


@pytest.mark.parametrize("depth", [65, 980, 5000])
def test_a_body_nested_past_the_limit_is_a_400_at_any_depth(depth):
    """orjson reads 980 levels; walking them afterwards hit Python's limit (a 500)."""
    from tornado import web

    from gpulab.service.api.request_body import parse_json_object

    body = b'{"name": ' + b"[" * depth + b"]" * depth + b', "v": [0.5, 1.5]}'
    with pytest.raises(web.HTTPError) as refused:
        parse_json_object(body)
    assert refused.value.status_code == 400, refused.value
    assert "more than 64 deep" in refused.value.log_message or "nested too deeply" in (
        refused.value.log_message
    )
    fine = b'{"name": ' + b"[" * 63 + b"1" + b"]" * 63 + b"}"
    assert parse_json_object(fine)["name"]


def test_a_body_read_fast_is_what_the_checked_parser_reads():
    import json

    import numpy as np

    from gpulab.service.api.request_body import parse_json_object

    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32).tolist()
    for body in (
        {"vector": vector, "k": 10, "filter": 'metadata["a"] == "x\\": 1"'},
        {"v": [1.5, 123456789012345678901234], "n": -9223372036854775808, "z": [0, 0.0]},
        {"rows": [{"id": "a", "m": {"b": [True, None, "c"]}}, {"id": "b"}]},
    ):
        raw = json.dumps(body).encode()
        parsed = parse_json_object(raw)
        assert parsed == body and json.dumps(parsed) == json.dumps(body)


# -- the hub down --------------------------------------------------------------------------
HUB_DOWN = {"error": "the hub is not answering; try again in a moment"}


async def test_while_the_hub_is_down_every_request_is_a_503_that_says_so(svc):
    alice = svc.create_user("alice")
    svc.hub_server.stop()  # the hub's API port refuses connections from now on
    await svc.hub_server.close_all_connections()
    for method, path, token in (
        ("GET", "/allocations", alice),  # a read: no answer about alice's token is kept
        ("POST", "/jobs", alice),  # a change: always asks the hub
        ("GET", "/audit", None),  # the admin's token
    ):
        r = await svc.request(method, path, token=token, json={} if method == "POST" else None)
        assert r.status_code == 503, (method, path, r.status_code, r.text)
        assert r.json() == HUB_DOWN


async def test_the_endpoint_router_says_the_hub_is_down_too():
    from jupyterhub.services.auth import HubAuth

    from gpulab.service.endpoints.router import Denied, EndpointRouter

    with socket.socket() as closed:  # a port nothing listens on: the hub gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    hub_auth = HubAuth(api_url=f"http://127.0.0.1:{port}/hub/api", api_token="t")

    async def identify(model):
        raise AssertionError("the hub answered nothing to identify")

    router = EndpointRouter(
        None, prefix="/services/gpulab/", max_upload_mib=1, identify=identify, hub_auth=hub_auth
    )
    with pytest.raises(Denied) as denied:
        await router._identify("a-token")
    assert (denied.value.status, str(denied.value)) == (503, HUB_DOWN["error"])
    assert router._lookups == {}


# -- /metrics for callers who may not see every job --------------------------------------
class _Owned:
    def collect(self):
        g = GaugeMetricFamily("gpulab_t", "t", labels=["job_id"])
        g.add_metric(["job-a"], 1)
        g.add_metric(["job-b"], 2)
        yield g
        d = GaugeMetricFamily("gpulab_d", "d", labels=["deployment", "version"])
        d.add_metric(["dep-a", "1"], 3)
        yield d
        c = GaugeMetricFamily("gpulab_c", "cluster", labels=["hostname"])
        c.add_metric(["node"], 4)
        yield c
        u = GaugeMetricFamily("gpulab_u", "by user", labels=["gpu", "user"])
        u.add_metric(["0", "alice"], 5)
        u.add_metric(["0", "bob"], 6)
        u.add_metric(["0", ""], 7)
        yield u


def test_metrics_show_a_caller_only_their_own_jobs_and_endpoints():
    from gpulab.service.telemetry.metrics import Metrics

    m = Metrics.__new__(Metrics)  # the service's Metrics, with only these series
    m.registry = CollectorRegistry()
    m.registry.register(_Owned())
    full = m.render().decode()
    assert 'job_id="job-a"' in full and 'job_id="job-b"' in full and "dep-a" in full
    mine = m.render(frozenset({"job-a"})).decode()
    assert 'job_id="job-a"' in mine and "job-b" not in mine and "dep-a" not in mine
    assert 'gpulab_c{hostname="node"} 4.0' in mine
    anonymous = m.render(frozenset()).decode()
    assert "job-a" not in anonymous and "dep-a" not in anonymous
    assert "# TYPE gpulab_t gauge" in anonymous  # the names stay, empty


async def test_metrics_without_a_token_show_no_ones_jobs_but_on_the_scrape_port(tmp_path):
    config = "c.TelemetrySettings.authenticate_prometheus = False\n"
    async with running_service(tmp_path / "svc", config=config) as svc:
        svc.app.metrics.registry.register(_Owned())
        bob = svc.create_user("bob")
        # Without a token, straight at the service's port (which users' pods reach to
        # call the API) or through the hub's proxy, or with a user's token: the
        # cluster's series, no one else's jobs or endpoints.
        forwarded = {"X-Forwarded-For": "127.0.0.1"}
        for r in (
            await svc.request("GET", "/../../metrics", anonymous=True),
            await svc.request("GET", "/../../metrics", anonymous=True, headers_extra=forwarded),
            await svc.request("GET", "/../../metrics", token=bob),
        ):
            assert r.status_code == 200
            assert "job-a" not in r.text and "dep-a" not in r.text
            assert 'gpulab_c{hostname="node"} 4.0' in r.text
            # Users' names and their GPU memory: bob's own only, no one else's.
            assert 'user="alice"' not in r.text and 'user=""' not in r.text
        assert 'user="bob"' in r.text  # the last one: bob's token
        admin = (await svc.request("GET", "/../../metrics")).text
        assert 'job_id="job-b"' in admin and 'user="alice"' in admin
        # Every series without a token only on the scrape port of its own
        # (c.TelemetrySettings.metrics_port), which the network keeps users off.
        server, port = listen(svc.app.make_metrics_app())
        try:
            async with httpx.AsyncClient() as client:
                for path in ("/services/gpulab/metrics", "/metrics"):
                    r = await client.get(f"http://127.0.0.1:{port}{path}")
                    assert r.status_code == 200, r.text
                    assert 'job_id="job-b"' in r.text and "dep-a" in r.text
                r = await client.get(f"http://127.0.0.1:{port}/services/gpulab/api/v1/jobs")
                assert r.status_code == 404  # the API is not on it
        finally:
            server.stop()


# -- the audit source --------------------------------------------------------------------
def test_x_forwarded_for_counts_only_from_the_platforms_own_socket():
    # A user's kernel straight to the service: its header is its own invention.
    assert client_source("127.0.0.1", "6.6.6.6", peer_is_platform=False) == "127.0.0.1"
    # Through the hub's proxy, which appended the kernel's 127.0.0.1.
    assert client_source("127.0.0.1", "6.6.6.6, 127.0.0.1", peer_is_platform=True) == "127.0.0.1"
    # A browser elsewhere, through the proxy.
    assert client_source("127.0.0.1", "6.6.6.6, 203.0.113.7", peer_is_platform=True) == (
        "203.0.113.7"
    )
    # A loopback peer nobody looked up is not believed.
    assert client_source("127.0.0.1", "6.6.6.6") == "127.0.0.1"


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's socket needs root")
def test_a_loopback_peer_is_told_apart_by_its_account():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        own = socket.create_connection(("127.0.0.1", port))
        conn, peer = server.accept()
        assert platform_peer(peer, conn.getsockname()) is True
        own.close()
        conn.close()

        nobody = pwd.getpwnam("nobody")
        code = (
            "import socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "sys.stdout.write('connected\\n'); sys.stdout.flush(); sys.stdin.read()\n"
        )
        other = subprocess.Popen(
            [sys.executable, "-c", code],
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert other.stdout.readline() == "connected\n"
            conn, peer = server.accept()
            assert platform_peer(peer, conn.getsockname()) is False
            conn.close()
        finally:
            other.stdin.close()
            other.wait(timeout=60)
    assert platform_peer(("203.0.113.7", 4242), ("127.0.0.1", port)) is None
