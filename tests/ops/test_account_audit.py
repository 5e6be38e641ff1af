"""Every step of an account in the audit trail, on the session's shared hub (`gpulab
up`, per-user passwords with admin approval): sign-ups, the admin's approval and
discard, logins (each refusal with its reason), password changes by the user and
by an admin, logout; each exactly once, with the client's address from the
proxy's hop (never a header the client wrote), and never a password.

(The same steps in a real browser: tests/browser/test_login_audit.py.)
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from urllib.parse import quote

import psutil
import pytest
import requests
from hubproc import fresh_user
from logins import (
    XSRF,
    admin_password,
    form_session,
    log_in,
    page_link,
    sign_up,
    toggle_approval,
)
from requests.adapters import HTTPAdapter
from support.wait import wait_until

from gpulab.hub_ext.audit_hook import MAX_TYPED_NAME, typed_name

pytestmark = pytest.mark.slow

PASSWORD = "login-audit-pass-5521"
NEW_PASSWORD = "login-audit-new-pass-8830"
ADMIN_SET = "set-by-the-admin-7741"
#: A loopback address of its own: the hub locks it out below, and nothing else uses it.
LOCKED_SOURCE = "127.0.0.23"
FORGED = "203.0.113.66"


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def audit(hub, **params) -> list[dict]:
    r = hub.gpulab("GET", "/audit", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def steps(rows) -> collections.Counter:
    return collections.Counter(
        (e["action"], e["actor"], e["actor_kind"], e["result"], e["detail"].get("reason"))
        for e in rows
    )


def wait_steps(hub, want: collections.Counter, **params) -> list[dict]:
    """Until the trail holds at least what is wanted (the hub sends its entries just
    after it answers); then the entries."""

    def enough():
        rows = audit(hub, **params)
        got = steps(rows)
        return rows if all(got[k] >= n for k, n in want.items()) else None

    return wait_until(
        enough, f"audit entries {dict(want)}", detail=lambda: json.dumps(audit(hub, **params))
    )


def try_log_in(hub, name: str, password: str) -> tuple[requests.Session, requests.Response]:
    s, xsrf = form_session(hub, "login")
    data = {"_xsrf": xsrf, "username": name, "password": password}
    return s, s.post(f"{hub.url}/hub/login", data=data, timeout=60)


def refused(hub, name: str, password: str) -> str:
    """The page of a refused login."""
    s, r = try_log_in(hub, name, password)
    assert r.status_code == 403, r.text[-500:]
    return r.text


def change_password(session, hub, path: str, **fields) -> str:
    page = session.get(f"{hub.url}/hub/{path}", timeout=30)
    assert page.status_code == 200, page.text[-500:]
    xsrf = XSRF.search(page.text).group(1)
    r = session.post(f"{hub.url}/hub/{path}", data={"_xsrf": xsrf, **fields}, timeout=60)
    assert r.status_code == 200, r.text[-500:]
    return r.text


def test_each_step_of_an_account_is_one_entry_with_its_reason(hub):
    name = fresh_user("audit-login")
    gone = fresh_user("audit-gone")
    stranger = fresh_user("audit-nobody")  # never signs up

    assert "sent to the admin" in sign_up(hub, name, PASSWORD).text
    assert "already in use" in sign_up(hub, name.upper(), PASSWORD).text
    assert "Something went wrong" in sign_up(hub, gone, "short").text
    assert "sent to the admin" in sign_up(hub, gone, PASSWORD).text
    # Not approved yet: the right password earns only a message.
    assert "has not been authorized" in refused(hub, name, PASSWORD)

    toggle_approval(hub, name)  # the admin approves name...
    admin = log_in(hub, "admin", admin_password(hub))
    page = admin.get(f"{hub.url}/hub/authorize", timeout=30).text
    r = admin.get(hub.url + page_link(page, "discard", gone), allow_redirects=False, timeout=30)
    assert r.status_code == 302  # ...and discards gone's sign-up

    assert "Invalid username or password" in refused(hub, name, "wrong-password-1")
    assert "Invalid username or password" in refused(hub, stranger, PASSWORD)
    user = log_in(hub, name, PASSWORD)
    assert user.get(f"{hub.url}/hub/api/user", timeout=30).json()["name"] == name

    said = change_password(
        user,
        hub,
        "change-password",
        old_password="not-the-password",
        new_password=NEW_PASSWORD,
        new_password_confirmation=NEW_PASSWORD,
    )
    assert "current password was incorrect" in said
    said = change_password(
        user,
        hub,
        "change-password",
        old_password=PASSWORD,
        new_password=NEW_PASSWORD,
        new_password_confirmation=NEW_PASSWORD,
    )
    assert "changed successfully" in said
    said = change_password(
        admin,
        hub,
        f"change-password/{name}",
        new_password=ADMIN_SET,
        new_password_confirmation=ADMIN_SET,
    )
    assert "changed successfully" in said
    assert log_in(hub, name, ADMIN_SET).get(f"{hub.url}/hub/api/user").status_code == 200
    user.get(f"{hub.url}/hub/logout", timeout=30)

    u = (name, "user")
    a = ("admin", "admin")
    want = collections.Counter(
        {
            ("user.signup", *u, "ok", None): 1,
            ("user.signup", *u, "denied", "name taken"): 1,  # the upper-case name is hers
            ("login", *u, "denied", "not approved"): 1,
            ("user.authorize", *a, "ok", None): 1,
            ("login", *u, "denied", "bad password"): 1,
            ("login", *u, "ok", None): 2,
            ("password.change", *u, "denied", "wrong current password"): 1,
            ("password.change", *u, "ok", None): 1,
            ("password.change", *a, "ok", None): 1,
            ("logout", *u, "ok", None): 1,
        }
    )
    rows = wait_steps(hub, want, user=name)
    assert steps(rows) == want, json.dumps(rows)
    assert all(e["subject"] == name and e["source"] == "127.0.0.1" for e in rows)
    [authorized] = [e for e in rows if e["action"] == "user.authorize"]
    assert authorized["detail"] == {"authorized": True}
    [signed_up] = [e for e in rows if e["action"] == "user.signup" and e["result"] == "ok"]
    assert signed_up["detail"] == {"approved": False}

    g = (gone, "user")
    want_gone = collections.Counter(
        {
            ("user.signup", *g, "failed", "password too short or common"): 1,
            ("user.signup", *g, "ok", None): 1,
            ("user.discard", *a, "ok", None): 1,
        }
    )
    assert steps(wait_steps(hub, want_gone, user=gone)) == want_gone
    want_stranger = collections.Counter({("login", stranger, "user", "denied", "unknown user"): 1})
    assert steps(wait_steps(hub, want_stranger, user=stranger)) == want_stranger

    everything = json.dumps(audit(hub))
    for secret in (PASSWORD, NEW_PASSWORD, ADMIN_SET, admin_password(hub), "wrong-password-1"):
        assert secret not in everything
    # The export carries them, with their source.
    r = hub.gpulab("GET", "/audit", params={"user": name, "format": "jsonl"})
    exported = [json.loads(line) for line in r.text.splitlines()]
    assert [(e["id"], e["source"]) for e in exported] == [(e["id"], e["source"]) for e in rows]


class FromAddress(HTTPAdapter):
    """Connects from a loopback address of its own, as another machine would from its own."""

    def __init__(self, address: str):
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def test_the_source_is_the_proxys_hop_and_a_lockout_says_so(hub):
    """The client writes X-Forwarded-For itself: the trail keeps the address the hub's
    proxy saw instead, and the same address is the one locked out."""
    s = requests.Session()
    s.mount(hub.url, FromAddress(LOCKED_SOURCE))
    s.headers["X-Forwarded-For"] = FORGED
    xsrf = XSRF.search(s.get(f"{hub.url}/hub/login", timeout=30).text).group(1)
    name = fresh_user("audit-locked")
    allowed = 10  # c.GpuLabNativeAuthenticator.allowed_failed_logins, by default
    for _ in range(allowed + 1):
        r = s.post(
            f"{hub.url}/hub/login",
            data={"_xsrf": xsrf, "username": name, "password": "guess"},
            timeout=30,
        )
        assert r.status_code == 403
    assert "Too many failed logins from your address" in r.text
    want = collections.Counter(
        {
            ("login", name, "user", "denied", "unknown user"): allowed,
            ("login", name, "user", "denied", "locked out"): 1,
        }
    )
    rows = wait_steps(hub, want, user=name)
    assert steps(rows) == want
    assert {e["source"] for e in rows} == {LOCKED_SOURCE}
    assert FORGED not in json.dumps(audit(hub))
    # Another address is not locked out: the admin still logs in.
    assert log_in(hub, "admin", admin_password(hub)).get(f"{hub.url}/hub/api/user").ok


#: A login straight to the hub's own port (past the proxy), as a kernel could send it.
LOG_IN_DIRECTLY = """
import http.cookiejar, re, sys, urllib.parse, urllib.request
port, name, forged = sys.argv[1:]
opener = urllib.request.build_opener(
    urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
opener.addheaders = [("X-Forwarded-For", forged)]  # the form's _xsrf is tied to it
url = f"http://127.0.0.1:{port}/hub/login"
page = opener.open(url).read().decode()
xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
body = urllib.parse.urlencode({"_xsrf": xsrf, "username": name, "password": "guess"})
try:
    opener.open(url, body.encode())
except urllib.error.HTTPError as e:
    print(e.code)
"""


def hub_port(hub) -> int:
    """The port the hub itself listens on (its only one; the proxy's is hub.port)."""
    [listening] = [
        c.laddr.port
        for c in psutil.Process(hub.proc.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    return listening


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another account needs root")
def test_another_account_past_the_proxy_cannot_choose_its_source(hub):
    """Another account on this machine (a user's kernel) reaches the hub's own port and
    writes X-Forwarded-For: its socket is not the proxy's, so the header is not
    believed; the entry says which account it was."""
    name = fresh_user("audit-direct")
    kernel = subprocess.run(
        [sys.executable, "-c", LOG_IN_DIRECTLY, str(hub_port(hub)), name, FORGED],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kernel.stdout.strip() == "403", kernel.stderr
    want = collections.Counter({("login", name, "user", "denied", "unknown user"): 1})
    [entry] = wait_steps(hub, want, user=name)
    assert entry["source"] == "127.0.0.1"
    assert entry["detail"]["local_account"] == "uid 65534"
    assert FORGED not in json.dumps(audit(hub))


def test_a_name_typed_badly_is_kept_escaped_and_cut(hub):
    log_from = hub.log_path.stat().st_size
    s, xsrf = form_session(hub, "login")
    # Bytes that are not UTF-8, a newline: refused with a message, not a server error.
    raw = f"_xsrf={quote(xsrf)}&username=eve%FF%0Aroot&password=guess%FFx".encode()
    r = s.post(
        f"{hub.url}/hub/login",
        data=raw,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=30,
    )
    assert r.status_code == 400 and "UTF-8" in r.text, r.text[-500:]
    long_name = "z" * 300
    assert "Invalid username" in refused(hub, long_name, "guess")

    escaped = "eve\\xff\\nroot"  # as the trail writes it
    want = collections.Counter({("login", escaped, "user", "denied", "form not UTF-8"): 1})
    [bad] = wait_steps(hub, want, user=escaped)
    assert bad["subject"] == escaped
    cut = typed_name(long_name)
    want = collections.Counter({("login", cut, "user", "denied", "unknown user"): 1})
    [long] = wait_steps(hub, want, user=cut)
    assert len(long["actor"]) <= MAX_TYPED_NAME
    assert "guess" not in json.dumps(audit(hub, action="login"))
    # Nor is the password in the hub's log (Tornado's own 400 would have written it).
    with open(hub.log_path, "rb") as log:
        log.seek(log_from)
        assert b"guess" not in log.read()


def test_typed_names_are_escaped_and_cut():
    assert typed_name(b"al\xffice") == "al\\xffice"
    assert typed_name("  ali\u200bce\n") == "ali\\u200bce"
    assert typed_name("ａｌｉｃｅ") == "ａｌｉｃｅ"  # prints: kept (the hub folds it at login)
    assert typed_name("") is None and typed_name(None) is None
    cut = typed_name("x" * 1000)
    assert len(cut) <= MAX_TYPED_NAME and cut.endswith("(1000 chars)")
