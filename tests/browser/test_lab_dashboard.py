"""The GPU dashboard as a JupyterLab tab, in a real Chromium against the shared hub
(two simulated A100-80GB): opened from the palette and from the gpulab panel, a card
per GPU whose charts gain points with no kernel running, the user's slice listed by
name, polling only while the tab is visible."""

import os
import time

import pytest
import requests
from hubproc import fresh_user
from lab_pages import lab_user, open_lab, run_command
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER = fresh_user("labdash")
PASSWORD = "labdash long password"
#: Points drawn in the dashboard's charts, per GPU card (what the test watches grow).
POINTS = """() => Array.from(document.querySelectorAll('.gpulab-Dashboard .gpulab-dash-gpu'))
  .map(card => Array.from(card.querySelectorAll('svg.gpulab-dash-chart'))
    .reduce((n, svg) => n + Number(svg.dataset.points || 0), 0))"""


@pytest.fixture(scope="module")
def token(hub):
    return lab_user(hub, USER, PASSWORD)


def kernels_and_sessions(hub, token) -> tuple[list, list]:
    """What the user's Jupyter server runs: its kernels and its sessions (REST API)."""
    base = f"{hub.url}/user/{USER}/api"
    auth = {"Authorization": f"token {token}"}
    return tuple(
        requests.get(f"{base}/{p}", headers=auth, timeout=60).json()
        for p in ("kernels", "sessions")
    )


def test_the_dashboard_tab_draws_live_without_a_kernel(browser, hub, token, artifacts_dir):
    context, page, errors = open_lab(browser, hub, USER, PASSWORD, width=1440)
    telemetry = []
    page.on(
        "request",
        lambda r: telemetry.append(time.monotonic()) if "/v1/telemetry" in r.url else None,
    )
    # The extension has loaded once its status bar item reads the slice.
    expect(page.locator(".gpulab-SliceStatus-text")).to_contain_text("1/4", timeout=120_000)
    assert kernels_and_sessions(hub, token) == ([], [])

    # From the palette: a tab in the main area, beside the launcher, like any other.
    run_command(page, "gpulab: Open GPU dashboard")
    dash = page.locator("#jp-main-dock-panel .gpulab-Dashboard")
    expect(dash).to_be_visible(timeout=60_000)
    tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text="GPU dashboard")
    expect(tab).to_have_count(1)

    # One card per simulated GPU: which node, which index, which model.
    cards = dash.locator(".gpulab-dash-gpu")
    expect(cards).to_have_count(2)
    for i in range(2):
        expect(cards.nth(i).locator(".gpulab-name")).to_have_text(f"GPU {i} · A100-80GB")
        expect(cards.nth(i).locator(".gpulab-state")).to_have_text("simulated")
        expect(cards.nth(i).locator("svg.gpulab-dash-chart")).to_have_count(1)  # the share held
    expect(dash).to_contain_text("GPUs are simulated")
    expect(dash.locator(".gpulab-dash-unmeasured").first).to_contain_text("not measured")
    expect(dash.locator(".gpulab-problem")).to_be_hidden()

    # The user's slice, by the name the service gives it, and its size.
    mine = f'.gpulab-dash-slice[data-name="{USER}\'s server"]'
    held = dash.locator(mine)
    expect(held).to_have_count(1)
    expect(held).to_contain_text("1/4 GPU")
    expect(held).to_contain_text("20 GiB")
    card = cards.filter(has=page.locator(mine))
    expect(card.locator('[data-metric="held"] .gpulab-dash-value')).not_to_have_text("none")

    # The charts gain points, every couple of seconds, with no kernel anywhere.
    first = page.evaluate(POINTS)

    def grown():
        now = page.evaluate(POINTS)
        if len(now) != len(first):
            return None
        return now if all(b > a for a, b in zip(first, now, strict=True)) else None

    later = wait_until(
        grown,
        "every GPU's chart to gain points",
        30,
        detail=lambda: f"first {first}, now {page.evaluate(POINTS)}",
    )
    assert len(later) == 2, later
    assert kernels_and_sessions(hub, token) == ([], [])

    # Some seconds of the share held drawn, for a screenshot that shows lines.
    wait_until(lambda: min(page.evaluate(POINTS)) >= 8, "some seconds of points to draw", 60)
    page.screenshot(path=os.path.join(artifacts_dir, "lab-dashboard.png"))

    # Hidden behind another tab it does not poll; shown again it does.
    page.locator("#jp-main-dock-panel .lm-TabBar-addButton").first.click()  # a launcher
    # In front (the lab may keep the launcher it opened with in a tab behind).
    expect(page.locator("#jp-main-dock-panel .jp-Launcher:visible")).to_have_count(1)
    expect(dash).to_be_hidden()
    # Playwright hands over the page's events while it waits (not in time.sleep).
    page.wait_for_timeout(1000)  # a request already under way when it was hidden
    hidden_at = time.monotonic()
    page.wait_for_timeout(6000)
    assert [t for t in telemetry if t < hidden_at], "no poll seen at all: the check is blind"
    assert not [t for t in telemetry if t > hidden_at], "the hidden dashboard kept polling"

    # The gpulab panel's button shows the same dashboard again (not a second one).
    run_command(page, "gpulab: Open panel")
    button = page.locator("#gpulab-panel .gpulab-dash-open")
    expect(button).to_be_visible()
    page.locator("#gpulab-panel").screenshot(
        path=os.path.join(artifacts_dir, "lab-dashboard-button.png")
    )
    button.click()
    expect(dash).to_be_visible()
    expect(tab).to_have_count(1)
    shown_at = time.monotonic()
    wait_until(
        lambda: page.wait_for_timeout(200) or [t for t in telemetry if t > shown_at],
        "the dashboard to poll again once shown",
        15,
        detail=lambda: f"{len(telemetry)} polls before; points now {page.evaluate(POINTS)}",
    )
    assert kernels_and_sessions(hub, token) == ([], [])

    # JupyterLab reopens it with the layout after a reload, still without a kernel.
    page.reload()
    expect(page.locator("#jp-main-dock-panel .gpulab-Dashboard .gpulab-dash-gpu")).to_have_count(
        2, timeout=120_000
    )
    assert kernels_and_sessions(hub, token) == ([], [])
    assert not errors, errors
    context.close()
