"""Logging in, in a real Chromium: per-user accounts with admin approval (the default)
and `gpulab up --demo`'s shared password, which says what it is."""

import os
import re

import psutil
import pytest
from hubproc import RunningHub
from logins import admin_password, browser_log_in, log_in, sign_up
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CAROL = "carols own long password"
WARNING = (
    "Demo login: anyone with the shared password can log in as any user. "
    "Restart without --demo for per-user accounts."
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("login-hub"), simulate="1xA100-80GB")
    yield h
    h.stop()


def hub_login_cookie(session) -> bool:
    return any(c.name.startswith("jupyterhub-hub-login") for c in session.cookies)


def test_sign_up_wait_for_approval_then_reach_the_spawn_form(browser, hub, artifacts_dir):
    def shot(page, name):
        return page.screenshot(path=os.path.join(artifacts_dir, name), full_page=True)

    carol = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    carol.set_default_timeout(120_000)
    carol.goto(f"{hub.url}/hub/login")
    carol.get_by_role("link", name="Sign up").click()
    carol.fill("#username_input", "carol")
    carol.fill("#password_input", CAROL)
    carol.fill("#password_confirmation_input", CAROL)
    carol.click("#signup_submit")
    expect(carol.locator(".alert")).to_contain_text("Your information has been sent to the admin")
    shot(carol, "login-1-signed-up.png")

    # Not approved yet: the right password only earns a message.
    browser_log_in(carol, hub, "carol", CAROL)
    expect(carol.locator(".login_error")).to_contain_text(
        "User carol has not been authorized by an administrator yet"
    )
    assert "/hub/login" in carol.url
    shot(carol, "login-2-not-authorized-yet.png")

    # ...and no way around the form: no hub user, no cookie, no server, no API.
    s = log_in(hub, "carol", CAROL)
    assert not hub_login_cookie(s)
    assert s.get(f"{hub.url}/hub/api/user").status_code == 403
    assert s.post(f"{hub.url}/hub/api/users/carol/server", json={}).status_code == 403
    assert s.get(f"{hub.api}/allocations").status_code in (401, 403)
    assert hub.hub_api("GET", "/users/carol").status_code == 404
    # A link elsewhere cannot make the admin's browser approve carol.
    r = log_in(hub, "admin", admin_password(hub)).get(
        f"{hub.url}/hub/authorize/carol",
        allow_redirects=False,
        headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
    )
    assert r.status_code == 403 and "own Authorize page" in r.text

    admin = browser.new_context(viewport={"width": 1280, "height": 600}).new_page()
    admin.set_default_timeout(120_000)
    browser_log_in(admin, hub, "admin", admin_password(hub))
    admin.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    admin.get_by_role("link", name="Authorize users").click()
    admin.wait_for_url(re.compile(r".*/hub/authorize$"))
    row = admin.locator("tr#carol")
    expect(row).to_contain_text("No")
    shot(admin, "login-3-admin-authorize.png")
    row.get_by_role("button", name="Authorize", exact=True).click()
    expect(admin.locator("tr#carol")).to_contain_text("Yes")
    shot(admin, "login-4-admin-authorized.png")

    browser_log_in(carol, hub, "carol", CAROL)
    carol.wait_for_url(re.compile(r".*/hub/spawn.*"))
    expect(carol.locator("fieldset.gpulab-slices")).to_contain_text("1/4 GPU")
    expect(carol.locator(".gpulab-demo-login")).to_have_count(0)
    expect(carol.get_by_role("link", name="Change password")).to_be_visible()
    expect(carol.get_by_role("link", name="Authorize users")).to_have_count(0)
    shot(carol, "login-5-spawn-form.png")


def test_one_password_opens_one_account(hub):
    sign_up(hub, "dora", "doras own long password")
    assert hub_login_cookie(log_in(hub, "admin", admin_password(hub)))
    # carol (approved above) and admin: each only with their own password.
    for name, password in [
        ("bob", CAROL),
        ("admin", CAROL),
        ("carol", admin_password(hub)),
        ("dora", "doras own long password"),
    ]:
        assert not hub_login_cookie(log_in(hub, name, password)), name
    # Case and Unicode compatibility forms are carol herself, with her password.
    for name in ("CAROL", "ｃａｒｏｌ"):
        s = log_in(hub, name, CAROL)
        me = s.get(f"{hub.url}/hub/api/user")
        assert hub_login_cookie(s) and me.json()["name"] == "carol", name
    # Nobody signs up as carol, admin, or a name that merely looks like them.
    for name in ("Carol", "ADMIN"):
        assert "already in use" in sign_up(hub, name, "another long password").text
    for name in ("\u0441arol", "c\u200barol"):  # Cyrillic с, a zero-width space
        assert "Something went wrong" in sign_up(hub, name, "another long password").text
    assert hub.hub_api("GET", "/users/\u0441arol").status_code == 404
    # Bad input is refused with a message, not a server error.
    s = log_in(hub, "carol", "x" * 100)
    assert not hub_login_cookie(s)
    r = sign_up(hub, "erin", "é" * 40)
    assert r.status_code == 400 and "at most 72 bytes" in r.text
    log = hub.log_tail(10_000_000)
    assert admin_password(hub) not in log and CAROL not in log


@pytest.fixture(scope="module")
def demo_hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("demo-hub"), simulate="1xA100-80GB", demo=True)
    yield h
    h.stop()


def test_demo_login_says_what_it_is(browser, demo_hub, artifacts_dir):
    log = demo_hub.log_tail(10_000_000)
    assert WARNING in log  # the banner
    shared = (demo_hub.data_dir / "user-password").read_text().strip()
    assert shared not in log and admin_password(demo_hub) not in log
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.set_default_timeout(120_000)
    browser_log_in(page, demo_hub, "anyone", shared)
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    expect(page.locator(".gpulab-demo-login")).to_have_text(WARNING)
    expect(page.locator("fieldset.gpulab-slices")).to_be_visible()
    page.screenshot(path=os.path.join(artifacts_dir, "login-demo-spawn-form.png"), full_page=True)

    # Servers (%gpulab) and the service carry the flag too.
    assert demo_hub.spawn("anyone", {"gpu_milli": 0}).status_code in (201, 202)
    demo_hub.wait_server("anyone")
    assert demo_hub.server_env("anyone")["GPULAB_DEMO_LOGIN"] == "1"
    assert psutil.Process(demo_hub.service_pid()).environ()["GPULAB_DEMO_LOGIN"] == "1"
