"""A person's path through the real hub in a real Chromium: log in, pick 1/4, watch the
spawn page say where it went, use it; the admin sees it on the hub's admin page.

alice has her own account (signed up, approved by the admin): the default login."""

import os
import re
import threading

import pytest
from hubproc import fresh_user
from lab_pages import click_launcher_card, watch_failed_requests
from logins import admin_password, browser_log_in, sign_up_approved
from playwright.sync_api import expect
from support.group_limits import limited_user
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]


ALICE = fresh_user("alice")
HOLDER = fresh_user("holder")


@pytest.fixture(scope="module")
def alice(hub):
    """alice signed up and approved, with a quota of half a GPU (a hub group's, this
    module's own)."""
    sign_up_approved(hub, ALICE, "alices own long password")
    # A hub user before her first login, to be in a group.
    assert hub.hub_api("POST", f"/users/{ALICE}").status_code in (201, 409)
    with limited_user(hub, ALICE, quota_milli=500):
        yield ALICE


def test_login_pick_a_quarter_and_see_it_in_the_kernel(browser, hub, alice, artifacts_dir):
    # Someone else already holds a whole GPU, so the form has something to say. The
    # form reads the ledger: the holder's slice is what it needs, not their JupyterLab
    # (which starts meanwhile; the admin page below waits for it).
    hub.hub_api("POST", f"/users/{HOLDER}")
    spawned = []
    holder = threading.Thread(target=lambda: spawned.append(hub.spawn(HOLDER, {"gpu_milli": 1000})))
    holder.start()
    wait_until(
        lambda: hub.gpulab("GET", "/allocations", params={"user": HOLDER}).json(),
        f"{HOLDER}'s slice in the ledger",
        timeout=120,
    )

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    failed = watch_failed_requests(page)
    browser_log_in(page, hub, ALICE, "alices own long password")
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    form = page.locator("fieldset.gpulab-slices")
    # Each size names the card and the memory it gives; one unit: the fraction.
    expect(page.locator("label[for=gpulab-slice-250]")).to_contain_text(
        "1/4 GPU · A100-80GB · 20 GiB"
    )
    expect(page.locator("label[for=gpulab-slice-500]")).to_contain_text(
        "1/2 GPU · A100-80GB · 40 GiB"
    )
    # 1 free GPU left: four quarters would fit, alice's quota (1/2 GPU) allows two.
    expect(page.locator("label[for=gpulab-slice-250]")).to_contain_text("2 can be placed now")
    expect(page.locator("#gpulab-slice-2000")).to_be_disabled()
    expect(page.locator("label[for=gpulab-slice-2000]")).to_contain_text(
        "over your quota (1/2 GPU left)"
    )
    expect(page.locator("label[for=gpulab-slice-1000]")).to_contain_text("over your quota")
    # A size that cannot be placed reads so, not only by its greyed button.
    expect(page.locator("label[for=gpulab-slice-2000]")).to_contain_text("unavailable: ")
    struck = page.locator("label[for=gpulab-slice-2000] .gpulab-size").evaluate(
        "e => getComputedStyle(e).textDecorationLine"
    )
    assert struck == "line-through", struck
    expect(form).to_contain_text("your quota is 1/2 GPU")
    expect(form).not_to_contain_text("milli")
    page.screenshot(path=os.path.join(artifacts_dir, "spawn-form.png"), full_page=True)

    page.check("#gpulab-slice-250")
    page.click("input[type=submit], button[type=submit]")
    # The spawn page says where the slice went and what holds it, while JupyterLab starts.
    page.wait_for_url(re.compile(rf".*/hub/spawn-pending/{re.escape(ALICE)}.*"))
    page.locator("#progress-details").evaluate("d => d.open = true")
    log = page.locator("#progress-log")
    placed = re.compile(r"Placed 1/4 GPU on A100-80GB #[01] of node \S+ \(20 GiB\)")
    expect(log).to_contain_text(placed)
    expect(log).to_contain_text("Enforced by: PyTorch memory limit + CUDA_VISIBLE_DEVICES")
    expect(log).to_contain_text("(simulated GPU: nothing enforced)")
    expect(log).to_contain_text("Starting JupyterLab…")
    page.screenshot(path=os.path.join(artifacts_dir, "spawn-progress.png"), full_page=True)
    page.wait_for_url(re.compile(rf".*/user/{re.escape(ALICE)}/lab.*"), timeout=240_000)

    click_launcher_card(page, "Python 3 (gpulab)", failed)
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
    expect(page.locator(".jp-OutputArea-output").nth(1)).to_contain_text(
        re.compile(r"GPU: .*1/4 GPU")
    )
    page.screenshot(path=os.path.join(artifacts_dir, "lab-slice.png"))
    page.close()
    holder.join()
    assert spawned[0].status_code in (201, 202), spawned[0].text
    hub.wait_server(HOLDER)

    # The admin sees every running server's slice on the hub's admin page, no row to open.
    admin = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    admin.set_default_timeout(120_000)
    browser_log_in(admin, hub, "admin", admin_password(hub))
    admin.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    admin.goto(f"{hub.url}/hub/admin")
    slices = admin.locator("#gpulab-slices")
    alice_row = slices.locator("tr", has_text=ALICE)
    expect(alice_row).to_contain_text("1/4 GPU")
    expect(alice_row).to_contain_text(re.compile(r"A100-80GB #[01]"))
    expect(alice_row).to_contain_text("20 GiB")
    node = hub.gpulab("GET", "/allocations", params={"user": ALICE}).json()[0]["node"]
    expect(alice_row).to_contain_text(node)
    expect(slices.locator("tr", has_text=HOLDER)).to_contain_text("1 GPU")
    # Then what jobs and endpoints hold, asked of the service once the page is drawn.
    held = admin.locator("#gpulab-held-all tbody")
    expect(held).not_to_contain_text("asking the gpulab service")
    expect(held).to_contain_text(re.compile(r"No job or endpoint holds a GPU slice\.|GPU"))
    # JupyterHub's own user list is still there below it.
    # The user list shows 50 a page, and the session's shared hub has more users.
    admin.get_by_placeholder("Search Users").fill(ALICE)
    expect(admin.locator("#react-admin-hook")).to_contain_text(ALICE)
    admin.screenshot(path=os.path.join(artifacts_dir, "admin-page.png"), full_page=True)
