"""Hibernate and wake as a user does, in a real Chromium against the shared hub:
the lab panel's Hibernate button, the hub's home page and spawn form saying so,
starting again on another size, and the notebook's cell saying what came back."""

import os
import re

import pytest
from hubproc import fresh_user
from lab_pages import lab_user, open_lab, run_command
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER = fresh_user("sleeper")
PASSWORD = "sleepers own long password"
#: A value the notebook cannot make again: after the wake it is the same only if it
#: came back, not if a cell ran again.
CELLS = [
    "import random\ntoken = random.random()",
    "lines = (line for line in ['generators and open files stay behind'])",
    "print('token', token)",
]


@pytest.fixture(scope="module")
def user(hub):
    return lab_user(hub, USER, PASSWORD, {"sleepy.ipynb": CELLS})


def open_notebook(page, hub):
    page.goto(f"{hub.url}/user/{USER}/lab/tree/sleepy.ipynb")
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)


def output_of(page, n: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(n).locator(".jp-OutputArea-output")


def test_hibernate_from_the_panel_and_wake_in_the_notebook(browser, hub, user, artifacts_dir):
    context, page, errors = open_lab(browser, hub, USER, PASSWORD)
    open_notebook(page, hub)
    run_command(page, "Run All Cells")
    expect(output_of(page, 2)).to_contain_text(re.compile(r"token 0\.\d+"))
    token = output_of(page, 2).inner_text().split()[-1]

    # The panel's Slice tab: never hibernated yet, and the button.
    page.locator(".gpulab-SliceStatus").click()
    part = page.locator("#gpulab-panel .gpulab-hibernation")
    expect(part).to_contain_text("Never hibernated.")
    part.locator("button.gpulab-hibernate").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Hibernate this server?")
    page.locator("#gpulab-panel").screenshot(
        path=os.path.join(artifacts_dir, "hibernate-panel.png")
    )
    dialog.locator("button", has_text="Hibernate").click()
    hub.wait_server(USER, ready=False)
    assert not [e for e in errors if "/gpulab/" in e], errors

    # The open tab goes by itself to the hub's home page, which says the server is
    # hibernated and how to wake it (JupyterLab's pollers end with the page).
    page.wait_for_url(re.compile(r".*/hub/home$"), timeout=120_000)
    box = page.locator("#gpulab-hibernated")
    expect(box).to_be_visible(timeout=30_000)
    expect(box).to_contain_text(
        re.compile(r"Your server is hibernated at \d\d:\d\d UTC: 1 kernel, ")
    )
    expect(box).to_contain_text("Start it at any size")
    page.screenshot(path=os.path.join(artifacts_dir, "hibernate-home.png"), full_page=True)

    # Start it on half a GPU: the form says it too.
    page.goto(f"{hub.url}/hub/spawn")
    expect(page.locator(".gpulab-hibernated")).to_contain_text("Your server is hibernated at ")
    page.screenshot(path=os.path.join(artifacts_dir, "hibernate-spawn-form.png"), full_page=True)
    page.check("#gpulab-slice-500")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(rf".*/user/{re.escape(USER)}/lab.*"), timeout=240_000)

    # Opening the notebook wakes it; the first cell run says what came back.
    open_notebook(page, hub)
    page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    out = output_of(page, 2)
    expect(out.first).to_contain_text("Woken from hibernation", timeout=60_000)
    said = r"sleepy\.ipynb: \d+ of \d+ variables back in (under )?[\d.]+ s; not back: lines \("
    expect(out.first).to_contain_text(re.compile(said))
    expect(out.last).to_contain_text(f"token {token}")
    page.screenshot(path=os.path.join(artifacts_dir, "hibernate-woken.png"))

    def woken():
        rows = hub.gpulab("GET", "/hibernations", token=user).json()
        return rows and rows[0]["state"] == "woken" and rows[0]

    wait_until(woken, "the service to hear of the wake", 60)
    # Running again: the home page no longer says "hibernated".
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_load_state("networkidle")
    expect(page.locator("#gpulab-hibernated")).to_be_hidden()
    context.close()
