"""One real hub for the widget tests: alice and bob each hold a real server's slice."""

import time

import pytest
from hubproc import RunningHub

from gpulab.client import Client


@pytest.fixture(scope="package")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("widgets-hub"), simulate="2xA100-80GB")
    yield h
    h.stop()


@pytest.fixture(scope="package")
def tokens(hub):
    """API tokens of alice (holding 1/4 GPU) and bob (1/2 GPU), and the admin's."""
    out = {name: hub.create_user(name) for name in ("alice", "bob")}
    for name, milli in (("alice", 250), ("bob", 500)):
        r = hub.spawn(name, {"gpu_milli": milli})
        assert r.status_code in (201, 202), r.text
    for name in ("alice", "bob"):
        hub.wait_server(name)
    out["admin"] = hub.admin_token
    return out


@pytest.fixture(scope="package")
def clients(hub, tokens):
    return {name: Client(hub.api, token=token) for name, token in tokens.items()}


def _wait_for(predicate, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@pytest.fixture(scope="session")
def wait_for():
    """Poll ``predicate`` until it returns something truthy (bounded; no timing claims)."""
    return _wait_for
