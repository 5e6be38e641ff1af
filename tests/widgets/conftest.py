"""One real hub for the widget tests: alice and bob (user names of their own,
``names``) each hold a real server's slice."""

import pytest
from hubproc import RunningHub, fresh_user
from support.wait import wait_until

from gpulab.client import Client


@pytest.fixture(scope="package")
def hub(tmp_path_factory):
    """A hub of their own: the dashboard's first answer backfills the service's whole
    recent history, which on the session's shared hub (running since the first hub
    test) is longer than the model keeps."""
    h = RunningHub(tmp_path_factory.mktemp("widgets-hub"), simulate="2xA100-80GB")
    yield h
    h.stop()


@pytest.fixture(scope="package")
def names():
    """The hub user names of the tests' "alice" and "bob" (no other test has them)."""
    return {"alice": fresh_user("alice"), "bob": fresh_user("bob"), "admin": "admin"}


@pytest.fixture(scope="package")
def tokens(hub, names):
    """API tokens of alice (holding 1/4 GPU) and bob (1/2 GPU), and the admin's."""
    out = {who: hub.create_user(names[who]) for who in ("alice", "bob")}
    for who, milli in (("alice", 250), ("bob", 500)):
        r = hub.spawn(names[who], {"gpu_milli": milli})
        assert r.status_code in (201, 202), r.text
    for who in ("alice", "bob"):
        hub.wait_server(names[who])
    out["admin"] = hub.admin_token
    return out


@pytest.fixture(scope="package")
def clients(hub, tokens):
    return {name: Client(hub.api, token=token) for name, token in tokens.items()}


def _wait_for(predicate, timeout=90.0, what="condition"):
    return wait_until(predicate, what, timeout)


@pytest.fixture(scope="session")
def wait_for():
    """Poll ``predicate`` until it returns something truthy (bounded; no timing claims)."""
    return _wait_for
