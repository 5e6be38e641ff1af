"""Wrong passwords lock out the address that typed them, never the account (issue 24:
"11 wrong admin passwords lock the admin out for 60 s, repeatably"; issue 45: "ten
wrong admin logins from any kernel lock the admin out": every kernel and the admin's
own browser reach the proxy over loopback).

The authenticator here is the one `gpulab up` runs, on a real hub database; the
requests are what Tornado hands it (peer address, headers, a real loopback
connection from the proxy's account). The same through the real proxy is in
tests/hub/test_signup_and_removal.py; the change-password form on a real hub is at
the end.
"""

import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hubproc import fresh_user
from jupyterhub import orm
from logins import XSRF, log_in, sign_up_approved
from nativeauthenticator.orm import UserInfo
from tornado.web import create_signed_value, decode_signed_value

from gpulab.hub_ext.login_devices import COOKIE
from gpulab.hub_ext.login_limits import THIS_MACHINE, SourceLockout, login_source
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


class ProxyConnection:
    """A real loopback connection made by this process's account, as the hub's
    configurable-http-proxy (run by the hub's account) holds one to the hub."""

    def __init__(self):
        self.server = socket.create_server((PROXY, 0))
        self.client = socket.create_connection(self.server.getsockname())
        self.conn, self.peer = self.server.accept()

    def close(self):
        for s in (self.conn, self.client, self.server):
            s.close()


@pytest.fixture(autouse=True)
def proxy():
    global _proxy
    _proxy = ProxyConnection()
    yield _proxy
    _proxy.close()


def via_proxy(client: str, **headers):
    """A request as it reaches the hub through the proxy, which appends the client."""
    forwarded = headers.pop("X_Forwarded_For", None)
    hops = f"{forwarded}, {client}" if forwarded else client
    req = request(PROXY, **{"X-Forwarded-For": hops, **headers})
    req.connection.context.address = _proxy.peer
    req.connection.stream = SimpleNamespace(socket=_proxy.conn)
    return req


class Browser:
    """A browser's cookie jar, and the hub's handler for its requests: the cookies the
    login page sets are signed with the hub's secret as JupyterHub signs them."""

    SECRET = b"the hub's cookie secret"

    def __init__(self):
        self.cookies: dict[str, bytes] = {}

    def handler(self, req):
        jar = self

        class Handler(SimpleNamespace):
            hub = SimpleNamespace(base_url="/hub/")

            def get_secure_cookie(self, name, max_age_days=31):
                value = jar.cookies.get(name)
                return value and decode_signed_value(
                    jar.SECRET, name, value, max_age_days=max_age_days
                )

            def _set_cookie(self, name, value, encrypted=True, **options):
                jar.cookies[name] = create_signed_value(jar.SECRET, name, value)

        return Handler(request=req)


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


async def login(auth, req, name, password, browser=None):
    handler = browser.handler(req) if browser else SimpleNamespace(request=req)
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
    assert auth.seconds_locked(auth.throttle_keys(None, login_source(attacker), "admin")) == 60
    # ...for the lock period, then may try again.
    auth.lockout.clock.now += 59
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) is None
    auth.lockout.clock.now += 1
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) == "admin"


async def test_guessing_many_names_locks_the_source_and_a_login_between_resets_nothing(auth):
    attacker = via_proxy("203.0.113.66")
    per_source = auth.allowed_failed_logins_per_source
    for i in range(per_source):
        # Any name counts, and the attacker's own good login clears nothing.
        assert await login(auth, attacker, f"user{i}", "guess") is None
        if i == 5:
            assert await login(auth, attacker, "admin", ADMIN_PASSWORD) == "admin"
    assert await login(auth, attacker, "admin", ADMIN_PASSWORD) is None
    assert await login(auth, via_proxy("198.51.100.7"), "admin", ADMIN_PASSWORD) == "admin"


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


async def test_an_ipv6_attacker_is_counted_by_its_64_not_by_each_address(auth):
    """One host or site gets a whole /64: counted by address, each guess could come
    from a fresh one."""
    for i in range(11):
        assert await login(auth, via_proxy(f"2001:db8:1:2::{i + 1:x}"), "admin", "guess") is None
    assert await login(auth, via_proxy("2001:db8:1:2::99"), "admin", ADMIN_PASSWORD) is None
    # Another /64 (another site) is not held up.
    assert await login(auth, via_proxy("2001:db8:1:3::1"), "admin", ADMIN_PASSWORD) == "admin"


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
        assert auth.seconds_locked(auth.throttle_keys(None, "uid 65534", "admin")) == 60
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


def test_forwarded_for_is_believed_only_from_the_hubs_proxy():
    """A pod or host that reaches the hub's port directly (on Kubernetes users' pods
    may) names any address it likes: only a proxy the site trusts is believed."""
    forged = request("192.0.2.5", **{"X-Forwarded-For": "198.51.100.7"})
    assert login_source(forged) == "192.0.2.5"
    forged.connection.context.trusted_downstream = {"192.0.2.5"}  # the site's proxy
    assert login_source(forged) == "198.51.100.7"


async def test_a_kernel_cannot_pick_a_fresh_loopback_address_per_try(auth):
    """Through the proxy a process of this machine may connect from any of 127/8:
    all of them are this machine, one source."""
    for i in range(10):
        kernel = via_proxy(f"127.0.{i}.{i + 2}")
        assert login_source(kernel) == THIS_MACHINE
        assert await login(auth, kernel, "admin", f"guess {i}") is None
    assert await login(auth, via_proxy("127.9.9.9"), "admin", ADMIN_PASSWORD) is None


async def test_a_kernel_cannot_lock_the_admin_out_of_her_own_browser(auth):
    """The admin's browser and every user's kernel reach the proxy over loopback on a
    one-machine install: the same source. Her browser has logged in before; a kernel
    typing wrong admin passwords locks only its own tries."""
    laptop = Browser()
    here = via_proxy("127.0.0.1")
    assert await login(auth, here, "admin", ADMIN_PASSWORD, laptop) == "admin"
    for i in range(11):
        assert await login(auth, via_proxy("127.0.0.1"), "admin", f"guess {i}") is None
    # The kernel waits, even with the right password; the admin's browser does not.
    assert await login(auth, via_proxy("127.0.0.1"), "admin", ADMIN_PASSWORD) is None
    assert await login(auth, here, "admin", ADMIN_PASSWORD, laptop) == "admin"
    assert COOKIE in laptop.cookies
    # Her own typos count for her browser alone, and lock it like any source.
    for i in range(10):
        assert await login(auth, here, "admin", f"typo {i}", laptop) is None
    assert await login(auth, here, "admin", ADMIN_PASSWORD, laptop) is None
    # A device cookie is signed by the hub: one written by hand counts for nothing.
    forged = Browser()
    forged.cookies[COOKIE] = json.dumps({"user": "admin", "id": "x"}).encode()
    assert await login(auth, via_proxy("127.0.0.1"), "admin", ADMIN_PASSWORD, forged) is None


async def test_guessing_one_users_password_does_not_lock_another_out(auth):
    """alice's kernel guesses bob's password: carol, on the same machine and with no
    device cookie yet, still logs in."""
    for name in ("bob", "carol"):
        info = UserInfo(username=name, password=b"", is_authorized=True)
        auth.db.add(info)
        auth.db.commit()
        assert auth.change_password(name, f"{name}'s long password 42")
    for i in range(11):
        assert await login(auth, via_proxy("127.0.0.1"), "bob", f"guess {i}") is None
    assert await login(auth, via_proxy("127.0.0.1"), "carol", "carol's long password 42") == (
        "carol"
    )
    assert await login(auth, via_proxy("127.0.0.1"), "bob", "bob's long password 42") is None


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


def test_the_change_password_form_is_throttled_like_login(plain_hub):
    """A logged-in session (or a kernel sending its own token to this page) guessing
    the current password: after allowed_failed_logins wrong ones even the right one
    is refused, and the password stays as it was."""
    hub, name, password = plain_hub, fresh_user("chpw"), "the first password 0123"
    sign_up_approved(hub, name, password)
    session = log_in(hub, name, password)
    page = f"{hub.url}/hub/change-password"

    def change(old: str, new: str):
        xsrf = XSRF.search(session.get(page, timeout=30).text).group(1)
        form = {"_xsrf": xsrf, "old_password": old}
        form |= {"new_password": new, "new_password_confirmation": new}
        return session.post(page, data=form, timeout=30)

    for i in range(10):
        r = change(f"guess {i}", "the new password 4567")
        assert "Your current password was incorrect" in r.text
    r = change(password, "the new password 4567")
    assert r.status_code == 403 and "Too many wrong passwords from your address" in r.text
    assert log_in(hub, name, password).get(f"{hub.url}/hub/api/user", timeout=30).ok
