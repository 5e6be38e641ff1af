"""Logging in to a test hub the way people do: sign up, get approved, log in.

The default login of `gpulab up` is per-user passwords with admin approval
(NativeAuthenticator); these helpers drive its pages over plain HTTP, and in a
browser where the test is about the browser.
"""

from __future__ import annotations

import html
import re

import requests

XSRF = re.compile(r'name="_xsrf" value="([^"]+)"')


def form_session(hub, path: str) -> tuple[requests.Session, str]:
    """A session holding the hub's _xsrf cookie, and the token its form needs."""
    s = requests.Session()
    if getattr(hub, "ca", None):  # a hub with --tls: its data dir's CA
        s.verify = str(hub.ca)
        s.trust_env = False  # else REQUESTS_CA_BUNDLE, where set, wins over s.verify
    r = s.get(f"{hub.url}/hub/{path}", timeout=30)
    r.raise_for_status()
    return s, XSRF.search(r.text).group(1)


def sign_up(hub, name: str, password: str) -> requests.Response:
    s, xsrf = form_session(hub, "signup")
    return s.post(
        f"{hub.url}/hub/signup",
        timeout=30,
        data={
            "_xsrf": xsrf,
            "username": name,
            "signup_password": password,
            "signup_password_confirmation": password,
        },
    )


def page_link(page: str, action: str, name: str) -> str:
    """The href of the Authorize page's ``action`` button (``authorize``, ``discard``)
    for the sign-up ``name``: the path with the page's ``_xsrf`` token, as clicked."""
    found = re.search(rf'href="([^"]*/{action}/{re.escape(name)}\?_xsrf=[^"]+)"', page)
    assert found, f"no {action} link for {name} on the Authorize page"
    return html.unescape(found.group(1))


def toggle_approval(hub, name: str) -> None:
    """What the admin's Authorize/Unauthorize button does (a hub page: cookie, no token)."""
    admin = log_in(hub, "admin", admin_password(hub))
    page = admin.get(f"{hub.url}/hub/authorize", timeout=30).text
    r = admin.get(hub.url + page_link(page, "authorize", name), allow_redirects=False, timeout=30)
    assert r.status_code == 302, (r.status_code, r.text[-500:])


def sign_up_approved(hub, name: str, password: str) -> None:
    assert "sent to the admin" in sign_up(hub, name, password).text
    toggle_approval(hub, name)


def log_in(hub, name: str, password: str) -> requests.Session:
    """A session logged in to the hub, or with no hub login if it failed."""
    s, xsrf = form_session(hub, "login")
    s.post(
        f"{hub.url}/hub/login",
        timeout=30,
        data={"_xsrf": xsrf, "username": name, "password": password},
    )
    return s


def browser_log_in(page, hub, name: str, password: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")


def admin_password(hub) -> str:
    return (hub.data_dir / "admin-password").read_text().strip()
