"""GPU-hour budgets on the real hub's spawn form, in a real Chromium: a group's budget set
as a hub group property (as an admin does on the admin page) shows as hours used and
left; a group at its budget sees why its GPU sizes are off, the figure and who can
raise it, and can still start without a GPU. In JupyterLab the status bar says what is
left."""

import os
import re

import lab_pages
import pytest
from hubproc import fresh_user
from logins import browser_log_in, sign_up_approved
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "a long budget password"


@pytest.fixture
def group_with_budget(hub):
    """Makes hub groups with a budget for one test, and removes them after it, so no
    later module on the shared hub sees them."""
    made = []

    def make(members: list[str], hours: float) -> str:
        made.append(_group_with_budget(hub, members, hours))
        return made[-1]

    yield make
    for name in made:
        hub.hub_api("DELETE", f"/groups/{name}")


def _group_with_budget(hub, members: list[str], hours: float) -> str:
    """A hub group of ``members`` whose property gives it ``hours`` GPU-hours a month."""
    name = fresh_user("budget-lab")
    assert hub.hub_api("POST", f"/groups/{name}").status_code in (200, 201)
    r = hub.hub_api("PUT", f"/groups/{name}/properties", json={"gpulab_budget_gpu_hours": hours})
    assert r.status_code == 200, r.text
    r = hub.hub_api("POST", f"/groups/{name}/users", json={"users": members})
    assert r.status_code == 200, r.text
    # The service reads the hub's groups at most every 10 s.
    wait_until(
        lambda: any(
            g["name"] == name
            for u in members
            for g in hub.gpulab("GET", "/budget", params={"user": u}).json()["groups"]
        ),
        f"{name}'s budget seen by the service",
        timeout=60,
    )
    return name


def test_the_form_shows_hours_used_and_left_and_refuses_a_group_at_its_budget(
    browser, hub, artifacts_dir, group_with_budget
):
    alice, bob = fresh_user("budget-alice"), fresh_user("budget-bob")
    sign_up_approved(hub, alice, PASSWORD)
    sign_up_approved(hub, bob, PASSWORD)
    for name in (alice, bob):  # hub users before their first login, to be in a group
        assert hub.hub_api("POST", f"/users/{name}").status_code in (201, 409)
    roomy = group_with_budget([alice], 10)
    spent = group_with_budget([bob], 0)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    browser_log_in(page, hub, alice, PASSWORD)
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    line = page.locator(".gpulab-budget")
    expect(line).to_contain_text("This month: 0 GPU-hours used")
    expect(line).to_contain_text(f"group {roomy}: 0 used, 10 left of its 10")
    expect(page.locator("#gpulab-slice-250")).to_be_enabled()
    page.screenshot(path=os.path.join(artifacts_dir, "budget-spawn-form.png"), full_page=True)
    page.close()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    browser_log_in(page, hub, bob, PASSWORD)
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    refusal = page.locator(".gpulab-budget-refusal")
    expect(refusal).to_contain_text(
        f"Group {spent} has used 0 of its 0 GPU-hours this month (until "
    )
    expect(refusal).to_contain_text("To raise it, ask an admin (")
    expect(page.locator("#gpulab-slice-250")).to_be_disabled()
    expect(page.locator("label[for=gpulab-slice-250]")).to_contain_text("over budget")
    expect(page.locator("#gpulab-slice-0")).to_be_checked()
    page.screenshot(
        path=os.path.join(artifacts_dir, "budget-spawn-form-refused.png"), full_page=True
    )
    page.close()


def test_the_lab_status_bar_says_the_hours_left(browser, hub, artifacts_dir, group_with_budget):
    carol = fresh_user("budget-carol")
    lab_pages.lab_user(hub, carol, PASSWORD, gpu_milli=0)
    group = group_with_budget([carol], 10)
    context, page, errors = lab_pages.open_lab(browser, hub, carol, PASSWORD)
    try:
        status = page.locator(".gpulab-SliceStatus")
        expect(status.locator(".gpulab-SliceStatus-text")).to_have_text("no GPU · 10 GPU-h left")
        title = status.get_attribute("title")
        assert f"group {group}: 0 GPU-hours used, 10 left of its 10" in title, title
        status.screenshot(path=os.path.join(artifacts_dir, "budget-status-bar.png"))
        assert not errors, errors
    finally:
        context.close()
