"""Wrong passwords lock out the address that typed them, never the account (issue 24:
"11 wrong admin passwords lock the admin out for 60 s, repeatably").

The authenticator here is the one `gpulab up` runs, on a real hub database; the
requests are what Tornado hands it (peer address, headers). The same through the
real proxy is in tests/hub/test_signup_and_removal.py.
"""

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from jupyterhub import orm

from gpulab.hub_ext.login_limits import SourceLockout, login_source
from gpulab.hub_ext.native_auth import GpuLabNativeAuthenticator

ADMIN_PASSWORD = "first-admin-password-0123456789abcdef"
PROXY = "127.0.0.1"  # configurable-http-proxy, as the hub sees it


class Clock:
    """The lockout's clock, moved by the test instead of waited for."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def request(peer: str, **headers):
    context = SimpleNamespace(address=(peer, 40000), trusted_downstream=set())
    return SimpleNamespace(
        connection=SimpleNamespace(context=context), headers=headers, remote_ip=peer
    )


def via_proxy(client: str, **headers):
    """A request as it reaches the hub through the proxy, which appends the client."""
    forwarded = headers.pop("X_Forwarded_For", None)
    hops = f"{forwarded}, {client}" if forwarded else client
    return request(PROXY, **{"X-Forwarded-For": hops, **headers})


@pytest.fixture
def auth(tmp_path):
    password_file = tmp_path / "admin-password"
    password_file.write_text(ADMIN_PASSWORD + "\n")
    db = orm.new_session_factory(f"sqlite:///{tmp_path}/jupyterhub.sqlite")()
    a = GpuLabNativeAuthenticator(
        _deprecated_db_session=db,
        admin_password_file=str(password_file),
        allow_all=True,
        admin_users={"admin"},
    )
    a.lockout.clock = Clock()
    return a


async def login(auth, req, name, password):
    handler = SimpleNamespace(request=req)
    user = await auth.get_authenticated_user(handler, {"username": name, "password": password})
    return user and user["name"]


async def test_wrong_admin_passwords_lock_the_attacker_not_the_admin(auth):
    attacker, admin = via_proxy("203.0.113.66"), via_proxy("198.51.100.7")
    for i in range(11):
        assert await login(auth, attacker, "admin", f"guess {i}") is None
    # The admin, from anywhere else, gets in at once.
    assert await login(auth, admin, "admin", ADMIN_PASSWORD) == "admin"
    # The attacker's address waits, even with the right password...
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) is None
    assert auth.lockout.seconds_locked(login_source(attacker)) == 60
    # ...for the lock period, then may try again.
    auth.lockout.clock.now += 59
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) is None
    auth.lockout.clock.now += 1
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) == "admin"


async def test_guessing_other_names_or_logging_in_between_does_not_reset_the_count(auth):
    attacker = via_proxy("203.0.113.66")
    for i in range(10):
        # Any name counts, and the attacker's own good login clears nothing.
        assert await login(auth, attacker, f"user{i}", "guess") is None
        if i == 5:
            assert await login(auth, attacker, "admin", ADMIN_PASSWORD) == "admin"
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) is None


async def test_a_client_cannot_choose_its_address_per_try(auth):
    for i in range(10):
        # Forged hops before the proxy's own, and X-Real-Ip (which Tornado's
        # remote_ip would believe), are ignored: the proxy's last hop counts.
        spoofed = via_proxy(
            "203.0.113.66", X_Forwarded_For=f"10.0.0.{i}", **{"X-Real-Ip": f"10.1.0.{i}"}
        )
        assert login_source(spoofed) == "203.0.113.66"
        assert await login(auth, spoofed, "admin", "guess") is None
    assert await login(auth, via_proxy("203.0.113.66"), "admin", ADMIN_PASSWORD) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another account needs root")
async def test_another_account_calling_the_hub_directly_is_counted_as_that_account(auth):
    """A kernel on the hub's host can reach the hub's own port, past the proxy, and
    send any X-Forwarded-For. Its socket is not the hub's account's, so its tries
    count for its account (uid), and the address it names is not locked."""
    server = socket.create_server(("127.0.0.1", 0))
    kernel = subprocess.Popen(
        [sys.executable, "-c", CONNECT_AND_WAIT, str(server.getsockname()[1])],
        user=65534,
        group=65534,
    )
    conn, peer = server.accept()
    try:
        forged = request(peer[0], **{"X-Forwarded-For": "198.51.100.7"})
        forged.connection.context.address = peer
        forged.connection.stream = SimpleNamespace(socket=conn)
        assert login_source(forged) == "uid 65534"
        for i in range(10):
            assert await login(auth, forged, "admin", f"guess {i}") is None
        assert auth.lockout.seconds_locked("uid 65534") == 60
        assert await login(auth, via_proxy("198.51.100.7"), "admin", ADMIN_PASSWORD) == "admin"
    finally:
        conn.close()
        server.close()
        kernel.wait()


CONNECT_AND_WAIT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.recv(1)
"""


def test_a_direct_connection_counts_by_its_peer():
    assert login_source(request("192.0.2.5")) == "192.0.2.5"
    assert login_source(request("192.0.2.5", **{"X-Forwarded-For": "not an address"})) == (
        "192.0.2.5"
    )


def test_memory_stays_bounded_and_old_counts_expire():
    clock = Clock()
    lockout = SourceLockout(allowed_failures=10, lock_seconds=60, max_sources=100, clock=clock)
    for i in range(5000):
        lockout.failed(f"10.{i // 256}.{i % 256}.1")
    assert len(lockout) == 100
    clock.now += 60
    lockout.failed("192.0.2.1")
    assert len(lockout) == 1


def test_the_lock_settings_count_per_address():
    help_text = GpuLabNativeAuthenticator.allowed_failed_logins.help
    assert "per client address" in help_text and "not per user name" in help_text
