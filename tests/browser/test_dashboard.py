"""The live dashboard in JupyterLab in a real Chromium: it draws, and keeps drawing
while the kernel is busy in another cell."""

import os
import re
import time

import pytest
from hubproc import RunningHub, fresh_user
from lab_pages import click_launcher_card, lab_user, watch_failed_requests
from logins import browser_log_in
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Points in the plotly graphs shown (a hidden tab's graph is drawn again when shown),
# and each cell's execution prompt ("[*]:" while it runs), read in one go so the two
# belong to the same moment.
READ_PAGE = """() => {
  const plots = Array.from(document.querySelectorAll('.gpulab-dashboard .js-plotly-plot'));
  const count = gd => (gd.data || []).reduce((n, t) => n + ((t.x && t.x.length) || 0), 0);
  const points = plots.filter(gd => gd.offsetParent !== null).map(count)
      .reduce((a, b) => a + b, 0);
  const prompts = Array.from(document.querySelectorAll(
      '.jp-Notebook .jp-Cell .jp-InputArea-prompt')).map(e => e.textContent.trim());
  // What the kernel says it holds (the status lines), to tell a stalled kernel-side
  // updater from updates that do not reach the plots.
  const held = Array.from(document.querySelectorAll('.gpulab-dashboard .gpulab-status'))
      .filter(e => e.offsetParent !== null).map(e => e.dataset.points);
  // ... and the shown status line's words: a failed redraw says why there.
  const status = Array.from(document.querySelectorAll('.gpulab-dashboard .gpulab-status'))
      .filter(e => e.offsetParent !== null).map(e => e.textContent.slice(0, 400));
  const each = plots.map(gd => [gd.offsetParent !== null, count(gd)]);  // [shown, points]
  return {points, prompts, held, plots: plots.length, each, status};
}"""


#: The user who opens the dashboard: a name no other test of the session has.
USER = fresh_user("alice")
#: The busy cell waits for this file in the user's home: the test writes it once it
#: has seen the plot grow while the cell runs.
GATE = "go-on"
#: How long the dashboard stays open, updating every second, before the check that
#: nothing was logged meanwhile.
OPEN_S = 30

# Every plotly graph shown on the dashboard's tab drawn by plotly (its layout and its
# SVG there), and at least ``least`` of them: a tab's graph is made when the tab is
# first shown, a round trip to the kernel after the click.
DRAWN = """least => {
  const shown = Array.from(document.querySelectorAll('.gpulab-dashboard .js-plotly-plot'))
    .filter(gd => gd.offsetParent !== null);
  return shown.length >= least
    && shown.every(gd => gd._fullLayout && gd.querySelector('.main-svg .cartesianlayer'));
}"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub of its own: the reload check below needs the service's telemetry history
    to be shorter than the dashboard's window, which a long-lived shared hub's is not."""
    h = RunningHub(tmp_path_factory.mktemp("dash-hub"), simulate="2xA100-80GB")
    yield h
    h.stop()


#: The browser's console errors and warnings, said when a wait times out (a plot that
#: stays empty in a slow CI run is diagnosed from them, not re-run by guess).
CONSOLE: list[str] = []


def watch_console(page) -> None:
    def keep(message):
        if message.type in ("error", "warning"):
            CONSOLE.append(f"{message.type}: {message.text[:300]}")

    page.on("console", keep)
    page.on("pageerror", lambda error: CONSOLE.append(f"error: uncaught {str(error)[:300]}"))


def wait_page(page, predicate, timeout=180.0, what="the page"):
    seen = []

    def shown():
        seen[:] = [page.evaluate(READ_PAGE)]
        return seen[0] if predicate(seen[0]) else None

    def detail():
        return f"last seen {seen}\nbrowser console (last 20): {CONSOLE[-20:]}"

    return wait_until(shown, what, timeout, detail=detail)


def run_cell(page, code):
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")


def test_dashboard_draws_and_updates_while_another_cell_sleeps(browser, hub, artifacts_dir):
    lab_user(hub, USER, "alices own long password")

    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    watch_console(page)
    failed = watch_failed_requests(page)
    page.set_default_timeout(120_000)
    browser_log_in(page, hub, USER, "alices own long password")
    page.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    page.goto(f"{hub.url}/user/{USER}/lab")
    click_launcher_card(page, "Python 3 (gpulab)", failed)
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()

    run_cell(page, "from gpulab.widgets import Dashboard; d = Dashboard(); d")
    board = page.locator(".gpulab-dashboard")
    expect(board.locator(".js-plotly-plot").first).to_be_visible(timeout=180_000)
    # No GPU here: one notice with the reason, no GPU charts; the slices are real.
    notice = board.locator(".gpulab-notice[data-source=gpu]")
    expect(notice).to_contain_text("No GPU telemetry on this machine", timeout=60_000)
    expect(notice).to_contain_text("no NVIDIA driver")
    expect(board.locator(".gpulab-notice:visible")).to_have_count(1)  # not one per chart
    expect(board).to_contain_text("you · 1/4 GPU", timeout=60_000)
    expect(board.locator("th", has_text="GPU memory used / total")).to_have_count(1, timeout=60_000)
    wait_page(page, lambda s: s["points"] > 0, what="points in the plot")
    opened = time.monotonic()
    assert "…" not in board.inner_text()
    board.screenshot(path=os.path.join(artifacts_dir, "dashboard-cluster.png"))

    # A busy cell: it runs until the test has seen the plot grow meanwhile.
    gate = hub.home(USER) / GATE
    run_cell(page, f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.2)")
    busy = wait_page(
        page,
        lambda s: len(s["prompts"]) >= 2 and "*" in s["prompts"][1],
        timeout=60,
        what="the sleeping cell to start",
    )
    # The plot must grow while the second cell still runs: same read, both facts.
    grown = wait_page(
        page,
        lambda s: "*" not in s["prompts"][1] or s["points"] > busy["points"],
        timeout=60,
        what="the plot to grow or the cell to finish",
    )
    assert "*" in grown["prompts"][1], (
        f"the sleeping cell finished before the plot grew: {busy} -> {grown}"
    )
    assert grown["points"] > busy["points"]
    # Meanwhile the kernel logged nothing: JupyterLab's log console counts what a
    # kernel prints outside a cell (a widget's message handler that fails, say, once
    # per update); its status bar item is empty until something is logged.
    logged = page.locator(".jp-LogConsoleStatusItem").inner_text().strip()
    assert not logged, f"the kernel logged {logged} message(s) while the dashboard updated"
    board.screenshot(path=os.path.join(artifacts_dir, "dashboard-while-busy.png"))
    hub.write_home_file(USER, GATE, "")
    wait_page(
        page, lambda s: "*" not in s["prompts"][1], timeout=60, what="the sleeping cell to finish"
    )

    for tab, text, graphs in (
        ("Network", "rdma missing on", 1),
        ("Cache", "No dataset cache reports on this machine", 0),
        ("Jobs", "no jobs to show", 1),
        ("Alerts", "No alerts in the last 24 h", 0),  # a new user's: nothing of theirs fires
    ):
        board.locator(".lm-TabBar-tab", has_text=tab).click()
        expect(board).to_contain_text(text, timeout=60_000)
        page.wait_for_function(DRAWN, arg=graphs)  # the tab's graph drawn, for the picture
        assert "…" not in board.inner_text(), f"text cut short on the {tab} tab"
        board.screenshot(path=os.path.join(artifacts_dir, f"dashboard-{tab.lower()}.png"))

    # Half a minute open, updating every second (30 updates; a failing widget message
    # handler logs once per update): the kernel logged nothing and the browser no error.
    time.sleep(max(0.0, OPEN_S - (time.monotonic() - opened)))  # the time itself, not a sync
    logged = page.locator(".jp-LogConsoleStatusItem").inner_text().strip()
    assert not logged, f"the kernel logged {logged} message(s) in the dashboard's first {OPEN_S} s"
    assert not [c for c in CONSOLE if c.startswith("error")], CONSOLE
    print(f"the dashboard was open {time.monotonic() - opened:.0f} s: no kernel message, no error")

    # After a page reload the kernel's live dashboard still holds its history:
    # showing it again draws every point it had, and it keeps updating.
    board.locator(".lm-TabBar-tab", has_text="Cluster").click()
    before = wait_page(page, lambda s: s["points"] > 0, what="points before the reload")
    page.reload()
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").last.click()
    run_cell(page, "d")
    expect(page.locator(".gpulab-dashboard .js-plotly-plot").first).to_be_visible(timeout=180_000)
    after = wait_page(
        page,
        lambda s: s["points"] > before["points"],
        what="the reloaded page to show the kept history and new points",
    )
    assert after["points"] > before["points"]
    assert not any("update failed" in line for line in after["status"]), after["status"]
    page.locator(".gpulab-dashboard").screenshot(
        path=os.path.join(artifacts_dir, "dashboard-after-reload.png")
    )
    page.close()
