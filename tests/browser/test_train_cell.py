"""``%%train_distributed`` cells in JupyterLab in a real Chromium.

A failing job shows its root cause in a few lines, and "Run All"
stops there; a finished job's charts and final metrics survive saving and
reloading the page (the widgets' state does not, so the cell keeps a static copy).
"""

import os
import re

import pytest
from cells import LINEAR  # noqa: E402
from hubproc import fresh_user
from lab_dialogs import dismiss_false_connection_lost
from lab_pages import lab_user
from logins import browser_log_in
from playwright.sync_api import expect
from support.wait import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER = fresh_user("trainer")
PASSWORD = "trainers own long password"
STEPS = 30

FAILING = [
    "class Net:\n    pass",
    # Net is sent, but rank 1 cannot build it: an error only the ranks can find.
    "%%train_distributed --nproc-per-node 2 --vars Net\n"
    "from gpulab.training import setup\n"
    "ctx = setup()\n"
    "model = Net(width=8) if ctx.rank == 1 else Net()\n",
    "print('the cell after the failing one ran')",
]
#: The ranks wait for this file in the user's home before they train, so the test
#: sees (and photographs) the charts before the first metric, however fast the job is.
GATE = "go-train"


def training_cell(gate: str) -> str:
    hold = f"import os, time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.2)\n"
    return (
        f"%%train_distributed --nproc-per-node 2 --checkpoint-every 10 "
        f"--env STEPS={STEPS} --env STEP_DELAY=0.3\n{hold}{LINEAR.strip()}\n"
    )


# The plotly graphs in the notebook: each trace's name, point count and extra data.
READ_PLOTS = """() => Array.from(document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea .js-plotly-plot'))
  .map(gd => (gd.data || []).map(t => ({
      name: t.name, n: (t.x && t.x.length) || 0, customdata: t.customdata || null})))"""


# The text of the first cell's plotly graphs (titles, axis labels, annotations).
CHART_TEXT = """() => Array.from(document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .js-plotly-plot'))
  .map(gd => gd.textContent).join(' ')"""


@pytest.fixture(scope="module")
def server(hub):
    """USER's server; the notebooks are put in their home before the spawn."""
    training = [training_cell(str(hub.home(USER) / GATE))]
    notebooks = {"failing.ipynb": FAILING, "training.ipynb": training}
    lab_user(hub, USER, PASSWORD, notebooks, gpu_milli=0)
    return USER


@pytest.fixture
def lab(browser, hub, server):
    """A fresh browser context logged in as USER (no tab of an earlier test)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    page.set_default_timeout(120_000)
    dismiss_false_connection_lost(page, hub, USER)
    browser_log_in(page, hub, USER, PASSWORD)
    page.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    yield page
    context.close()


def open_notebook(page, hub, name, first_line):
    page.goto(f"{hub.url}/user/{USER}/lab/tree/{name}")
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    # Focus this notebook's first cell, so that "Run All" is this notebook's.
    first = cells(page).first
    expect(first).to_contain_text(first_line, timeout=60_000)
    first.locator(".jp-InputArea-prompt").click()


def run_all(page):
    """Run > Run All Cells; again if it queued no cell (on a loaded machine a menu click
    can land before the notebook takes it). A queued cell's prompt is ``[*]:`` at once,
    so running it twice is not possible."""
    first = cells(page).first.locator(".jp-InputArea-prompt")
    for _ in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            expect(first).not_to_have_text(re.compile(r"^\[ \]:$"), timeout=30_000)
            return
        except AssertionError:
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells queued no cell (3 tries)")


def cells(page):
    """The code cells of the notebook in front (an earlier test's stays open behind)."""
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-CodeCell")


def visible_lines(locator) -> list[str]:
    return [line for line in locator.inner_text().splitlines() if line.strip()]


def test_a_failing_rank_is_told_short_and_stops_run_all(lab, hub, artifacts_dir):
    page = lab
    open_notebook(page, hub, "failing.ipynb", "class Net")
    run_all(page)
    failing = cells(page).nth(1)
    error = failing.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']")
    expect(error).to_contain_text("rank 1 raised TypeError", timeout=300_000)
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    output = failing.locator(".jp-OutputArea")
    lines = visible_lines(output)
    print(f"failing cell: {len(lines)} visible output lines:\n" + "\n".join(lines))
    assert len(lines) < 25, lines
    text = "\n".join(lines)
    assert "rank 1 raised TypeError: Net() takes no arguments" in text
    assert "cell, line 4" in text and "model = Net(width=8)" in text  # the user's own line
    assert text.count("TypeError") == 1, text  # the cause once, not once per rank or dump
    assert "ChildFailedError" not in text and "magics/train.py" not in text
    assert "job_logs(" in text
    # The full logs are one click away, folded.
    logs = output.locator("details.gpulab-train-logs")
    expect(logs).to_have_count(1)
    expect(logs.locator("pre")).to_be_hidden()
    # Run All stopped at the failing cell: the next one never ran.
    after = cells(page).nth(2)
    expect(after.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"^\[ \]:$"))
    expect(after.locator(".jp-OutputArea")).not_to_contain_text("ran")
    failing.screenshot(path=os.path.join(artifacts_dir, "train-error.png"))
    logs.locator("summary").click()
    expect(logs.locator("pre")).to_contain_text("[r1]")


def test_charts_and_final_metrics_survive_a_page_reload(lab, hub, artifacts_dir):
    page = lab
    open_notebook(page, hub, "training.ipynb", "%%train_distributed")
    run_all(page)
    cell = cells(page).first
    # The live chart's note is SVG text inside plotly's graph: read it from the DOM.
    wait_until(
        lambda: page.evaluate(CHART_TEXT).count("waiting for the first metric") == 3,
        "the live charts to say they wait for the first metric",
        timeout=180,
        detail=lambda: (
            page.screenshot(path=os.path.join(artifacts_dir, "train-debug.png"))
            and "page: tests/artifacts/train-debug.png"
        ),
    )
    cell.screenshot(path=os.path.join(artifacts_dir, "train-waiting.png"))
    hub.write_home_file(USER, GATE, "")
    summary = cell.locator(".gpulab-train-summary")
    expect(summary).to_contain_text("succeeded", timeout=400_000)
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)

    token = hub.create_user(USER)  # a fresh token of the user's, for the API
    [job] = [j for j in hub.gpulab("GET", "/jobs", token=token).json() if j["state"] == "succeeded"]
    records = hub.gpulab("GET", f"/jobs/{job['id']}/metrics", token=token).json()["records"]
    final_loss = f"{records[-1]['loss']:.4g}"

    # JupyterLab's plotly renderer stores a PNG of the drawn figure in the output,
    # which marks the notebook changed again: save until it stays saved.
    expect(cell.locator(".jp-RenderedPlotly.js-plotly-plot")).to_be_visible(timeout=60_000)
    tab = page.locator(".lm-TabBar-tab", has_text="training.ipynb")

    def saved():
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1500)
        return "jp-mod-dirty" not in (tab.get_attribute("class") or "")

    wait_until(saved, "the notebook saved", timeout=60, every=1)
    page.reload()
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    cell = cells(page).first
    expect(cell.locator(".gpulab-train-summary")).to_contain_text(final_loss, timeout=60_000)
    expect(cell.locator(".gpulab-train-summary")).to_contain_text(f"{STEPS} / {STEPS}")
    # JupyterLab's plotly renderer shows the picture it saved with the figure (a PNG
    # beside the plotly JSON) or, without one, draws the graph; on hover, the graph.
    rendered = cell.locator(".jp-RenderedPlotly")
    expect(rendered).to_be_visible(timeout=60_000)
    src = rendered.locator("img.plot-img").get_attribute("src") or ""
    print(f"after the reload the chart shows as {'a PNG' if src else 'a graph'}")
    if src:
        assert src.startswith("data:image/png;base64,") and len(src) > 5000, src[:80]
    assert "waiting for the first metric" not in cell.inner_text()
    # No widget whose state the saved notebook lacks ("Error displaying widget").
    assert "Error displaying widget" not in cell.inner_text()
    rendered.hover()
    plots = wait_until(
        lambda: (p := page.evaluate(READ_PLOTS)) and p[0] and p,
        "the saved figure drawn as a graph again after the reload",
        timeout=120,
    )
    traces = {t["name"]: t for t in plots[0]}
    assert traces["loss"]["n"] == STEPS, plots
    assert {20, 30} <= set(traces["checkpoint"]["customdata"] or []), plots
    assert cell.locator(".js-plotly-plot svg path").count() > 0
    expect(cell.locator(".js-plotly-plot")).to_contain_text("step")
    assert "waiting for the first metric" not in (cell.locator(".js-plotly-plot").text_content())
    cell.screenshot(path=os.path.join(artifacts_dir, "train-after-reload.png"))
