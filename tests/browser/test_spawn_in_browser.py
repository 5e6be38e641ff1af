"""A person's path through the real hub in a real Chromium: log in, pick 1/4, use it.

alice has her own account (signed up, approved by the admin): the default login."""

import os
import re

import pytest
from hubproc import fresh_user
from logins import admin_password, browser_log_in, sign_up_approved
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]


#: alice's hub name; her quota is 500 milli-GPU (SHARED_HUB_CONFIG in tests/conftest.py).
ALICE = "alice-browser"
HOLDER = fresh_user("holder")


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub (empty when this module starts)."""
    return plain_hub


def test_login_pick_a_quarter_and_see_it_in_the_kernel(browser, hub, artifacts_dir):
    # Someone else already holds a whole GPU, so the form has something to say.
    hub.hub_api("POST", f"/users/{HOLDER}")
    assert hub.spawn(HOLDER, {"gpu_milli": 1000}).status_code in (201, 202)
    hub.wait_server(HOLDER)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    sign_up_approved(hub, ALICE, "alices own long password")
    browser_log_in(page, hub, ALICE, "alices own long password")
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    form = page.locator("fieldset.gpulab-slices")
    expect(form).to_contain_text("1/4 GPU")
    # 1 free GPU left: four quarters would fit, alice's quota (500) allows two.
    expect(page.locator("label[for=gpulab-slice-250]")).to_contain_text("2 can be placed now")
    expect(page.locator("#gpulab-slice-2000")).to_be_disabled()
    expect(page.locator("label[for=gpulab-slice-2000]")).to_contain_text("over your quota")
    expect(page.locator("label[for=gpulab-slice-1000]")).to_contain_text("over your quota")
    page.screenshot(path=os.path.join(artifacts_dir, "spawn-form.png"), full_page=True)

    page.check("#gpulab-slice-250")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(rf".*/user/{re.escape(ALICE)}/lab.*"), timeout=240_000)

    page.locator(".jp-LauncherCard", has_text="Python 3 (gpulab)").first.click()
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    page.keyboard.type(
        'import os; print("slice", os.environ["GPULAB_GPU_MILLI"], '
        'os.environ["CUDA_VISIBLE_DEVICES"])'
    )
    page.keyboard.press("Shift+Enter")
    uuid = hub.gpulab("GET", "/allocations", params={"user": ALICE}).json()[0]["gpu_uuid"]
    expect(page.locator(".jp-OutputArea-output").first).to_contain_text(f"slice 250 {uuid}")
    # The magics were loaded by gpulab's kernelspec, no %load_ext needed.
    page.keyboard.type("%gpulab")
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-OutputArea-output").nth(1)).to_contain_text("GPU: 250 milli-GPU")
    page.screenshot(path=os.path.join(artifacts_dir, "lab-slice.png"))
    page.close()

    # The admin sees alice's slice on the gpulab page of the hub.
    admin = browser.new_context().new_page()
    admin.set_default_timeout(120_000)
    browser_log_in(admin, hub, "admin", admin_password(hub))
    admin.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    admin.goto(f"{hub.url}/services/gpulab/")
    expect(admin.locator("h2", has_text="every user's allocations")).to_be_visible()
    expect(admin.locator("table").nth(1)).to_contain_text(f"{ALICE}/")
    expect(admin.locator("table").nth(1)).to_contain_text(f"{HOLDER}/")
    admin.screenshot(path=os.path.join(artifacts_dir, "admin-page.png"), full_page=True)
