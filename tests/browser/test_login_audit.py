"""The audit trail of accounts, driven from a real Chromium on the session's shared hub:
two people sign up, the admin approves one and discards the other, the approved one
logs in with a wrong password and then the right one, changes her password and logs
out. ``GET /audit`` (the admin's token) then shows each step once, with its result,
its reason, and the address the browser connected from, not the one its requests
claimed in X-Forwarded-For; the export carries the same entries.
(Each refusal and its reason, over HTTP: tests/ops/test_account_audit.py.)
"""

from __future__ import annotations

import collections
import json
import os
import re

import pytest
from hubproc import fresh_user
from logins import admin_password, browser_log_in
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "fionas first long password"
NEW_PASSWORD = "fionas second long password"
#: What every request of the newcomer's browser claims to come from.
FORGED = "203.0.113.99"


def audit(hub, **params) -> list[dict]:
    r = hub.gpulab("GET", "/audit", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def steps(rows) -> collections.Counter:
    return collections.Counter(
        (e["action"], e["actor"], e["result"], e["detail"].get("reason")) for e in rows
    )


def wait_steps(hub, want: collections.Counter, user: str) -> list[dict]:
    def enough():
        rows = audit(hub, user=user)
        got = steps(rows)
        return rows if all(got[k] >= n for k, n in want.items()) else None

    return wait_until(enough, f"{user}'s audit entries", detail=lambda: json.dumps(audit(hub)))


def sign_up_in(page, hub, name: str, password: str) -> None:
    page.goto(f"{hub.url}/hub/signup")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.fill("#password_confirmation_input", password)
    page.click("#signup_submit")
    expect(page.locator(".alert")).to_contain_text("Your information has been sent to the admin")


def test_each_step_of_an_account_in_a_browser_is_in_the_audit(browser, hub, artifacts_dir):
    name = fresh_user("fiona")
    gone = fresh_user("gus")
    newcomer = browser.new_context(
        viewport={"width": 1280, "height": 800}, extra_http_headers={"X-Forwarded-For": FORGED}
    ).new_page()
    newcomer.set_default_timeout(120_000)
    sign_up_in(newcomer, hub, name, PASSWORD)
    sign_up_in(newcomer, hub, gone, PASSWORD)

    admin = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    admin.set_default_timeout(120_000)
    browser_log_in(admin, hub, "admin", admin_password(hub))
    admin.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    admin.get_by_role("link", name="Authorize users").click()
    admin.wait_for_url(re.compile(r".*/hub/authorize$"))
    admin.locator(f"tr#{name}").get_by_role("button", name="Authorize", exact=True).click()
    expect(admin.locator(f"tr#{name}")).to_contain_text("Yes")
    admin.locator(f"tr#{gone}").get_by_role("button", name="Discard").click()
    expect(admin.locator(f"tr#{gone}")).to_have_count(0)

    browser_log_in(newcomer, hub, name, "not her password")
    expect(newcomer.locator(".login_error")).to_contain_text("Invalid username or password")
    browser_log_in(newcomer, hub, name, PASSWORD)
    newcomer.wait_for_url(re.compile(r".*/hub/spawn.*"))
    newcomer.get_by_role("link", name="Change password").click()
    newcomer.fill("#old_password_input", PASSWORD)
    newcomer.fill("#new_password_input", NEW_PASSWORD)
    newcomer.fill("#new_password_confirmation_input", NEW_PASSWORD)
    newcomer.click("#signup_submit")
    expect(newcomer.locator(".alert")).to_contain_text("changed successfully")
    newcomer.screenshot(
        path=os.path.join(artifacts_dir, "login-audit-password-changed.png"), full_page=True
    )
    newcomer.goto(f"{hub.url}/hub/logout")
    newcomer.wait_for_url(re.compile(r".*/hub/login.*"))

    want = collections.Counter(
        {
            ("user.signup", name, "ok", None): 1,
            ("user.authorize", "admin", "ok", None): 1,
            ("login", name, "denied", "bad password"): 1,
            ("login", name, "ok", None): 1,
            ("password.change", name, "ok", None): 1,
            ("logout", name, "ok", None): 1,
        }
    )
    rows = wait_steps(hub, want, name)
    assert steps(rows) == want, json.dumps(rows)
    # Where the browser connected from (through the hub's proxy), not what it claimed.
    assert {e["source"] for e in rows} == {"127.0.0.1"}
    want_gone = collections.Counter(
        {("user.signup", gone, "ok", None): 1, ("user.discard", "admin", "ok", None): 1}
    )
    gone_rows = wait_steps(hub, want_gone, gone)
    assert steps(gone_rows) == want_gone
    everything = json.dumps(audit(hub))
    assert FORGED not in everything
    assert PASSWORD not in everything and NEW_PASSWORD not in everything

    # The admin's export: the same entries, each with its source.
    r = hub.gpulab("GET", "/audit", params={"user": name, "format": "jsonl"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
    exported = [json.loads(line) for line in r.text.splitlines()]
    assert [(e["id"], e["action"], e["source"]) for e in exported] == [
        (e["id"], e["action"], e["source"]) for e in rows
    ]
