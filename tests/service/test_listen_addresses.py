"""c.GpuLabService.extra_listen_ips: checked when read, listened on beside the service's
own URL, and skipped with a warning where this machine lacks the address (live, with
the Slurm sandbox's nodes: tests/slurm/test_slurm_spawner.py)."""

import socket

import pytest
from tornado.httpserver import HTTPServer
from tornado.web import Application

from gpulab.service.listen_addresses import check_addresses, extra_addresses, listen_extra
from gpulab.spawner.slurm import api_url_at


def test_addresses_are_ips_once_each():
    assert check_addresses(["10.77.0.1", "10.77.0.1", "[fd00::1]"]) == ["10.77.0.1", "fd00::1"]
    with pytest.raises(ValueError, match="'bridge' is not an IP address"):
        check_addresses(["bridge"])
    with pytest.raises(ValueError, match="every address of this machine"):
        check_addresses(["0.0.0.0"])


def test_the_urls_own_address_is_not_listened_on_twice():
    assert extra_addresses(["127.0.0.1", "127.0.0.2"], "127.0.0.1") == ["127.0.0.2"]
    assert extra_addresses([], "127.0.0.1") == []


async def test_listens_on_each_and_skips_one_this_machine_lacks(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(Application())
    try:
        server.listen(port, "127.0.0.1")
        # 192.0.2.1 (TEST-NET-1) is no address of this machine: a warning, not a failure.
        ips = ["127.0.0.2", "192.0.2.1"]
        assert listen_extra(server, port, ips, "127.0.0.1") == ["127.0.0.2"]
        with socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
        assert "Not listening on 192.0.2.1" in caplog.text
    finally:
        server.stop()


def test_the_nodes_url_is_the_services_with_the_bridge_for_host():
    url = "http://127.0.0.1:41234/services/gpulab/api/v1"
    assert api_url_at(url, "10.77.0.1") == "http://10.77.0.1:41234/services/gpulab/api/v1"
    assert api_url_at(url, "fd00::1") == "http://[fd00::1]:41234/services/gpulab/api/v1"
    assert api_url_at("https://svc/api", "10.0.0.2") == "https://10.0.0.2:443/api"
