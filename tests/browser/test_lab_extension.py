"""gpulab inside JupyterLab, in a real Chromium against the shared hub: the slice in
the status bar, the side panel's jobs (progress, logs, cancel) and endpoints (URL,
copy curl), a section docked in the main area; and the server extension's proxy
closed to every other user's token."""

import os
import re
import sys
import time

import pytest
import requests
import torch

# The job helpers live beside the job tests.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "jobs"))

import lab_pages
from cells import FAILS_ON_RANK_1, LINEAR
from hubproc import fresh_user
from jobhelpers import submit, wait_job
from logins import log_in
from playwright.sync_api import expect
from support.wait import wait_until

from gpulab.client import Client
from gpulab.serving.export import export_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER = fresh_user("lab")
OTHER = fresh_user("lab-other")
PASSWORD = "labs own long password"
ENDPOINT = "labtiny"
#: A notebook of the user's: the endpoint listing, then a training cell that reads a
#: notebook class it does not send.
LISTING = [
    "%deploy --list",
    "class Net:\n    pass",
    "%%train_distributed --nproc-per-node 2\nfrom gpulab.training import setup\nmodel = Net()\n",
]


@pytest.fixture(scope="module")
def tokens(hub):
    return {
        USER: lab_pages.lab_user(hub, USER, PASSWORD, {"listing.ipynb": LISTING}),
        OTHER: hub.create_user(OTHER),
    }


def test_the_proxy_answers_only_whoever_may_use_the_server(hub, tokens):
    """Another user's hub token does not reach the owner's gpulab routes; the
    owner's does, and the service then answers as the owner."""
    base = f"{hub.url}/user/{USER}/gpulab"
    for path in ("/slice", "/api/v1/jobs", "/api/v1/allocations"):
        r = requests.get(
            base + path,
            headers={"Authorization": f"token {tokens[OTHER]}"},
            allow_redirects=False,
            timeout=60,
        )
        assert r.status_code == 403, (path, r.status_code, r.text[:300])
        r = requests.get(base + path, allow_redirects=False, timeout=60)
        assert r.status_code in (302, 403), (path, r.status_code, r.text[:300])
    r = requests.get(
        base + "/api/v1/allocations",
        headers={"Authorization": f"token {tokens[USER]}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text[:300]
    assert {a["user"] for a in r.json()} == {USER}

    # The owner's own login cookie, as a page on another site could send it: reading
    # works, but a POST without JupyterLab's XSRF header is refused (no job started).
    s = log_in(hub, USER, PASSWORD)
    assert s.get(f"{hub.url}/user/{USER}/lab", timeout=120).ok  # OAuth sets the cookie
    assert s.get(base + "/slice", timeout=60).json()["milli"] == 250
    r = s.post(base + "/api/v1/jobs", json={"code": "print(1)"}, timeout=60)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert hub.gpulab("GET", "/jobs", token=tokens[USER]).json() == []
    # "Try it" reaches only endpoints the service lets the user call: another user's
    # token gets no further than the server; a climb out of the endpoint front is refused.
    try_url = f"{base}/try/{OTHER}/theirs/v2/models/theirs/infer"
    r = requests.post(try_url, headers={"Authorization": f"token {tokens[OTHER]}"}, timeout=60)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    r = requests.post(try_url, headers={"Authorization": f"token {tokens[USER]}"}, timeout=60)
    assert r.status_code == 403 and "not shared with you" in r.json()["error"], r.text[:300]
    r = requests.post(
        f"{base}/try/%2E%2E/%2E%2E/api/v1/jobs",  # quoted: the client keeps the dots
        headers={"Authorization": f"token {tokens[USER]}"},
        data=b'{"code": "print(1)"}',
        timeout=60,
    )
    assert r.status_code in (400, 404), (r.status_code, r.text[:300])
    assert hub.gpulab("GET", "/jobs", token=tokens[USER]).json() == []


def open_lab(browser, hub):
    return lab_pages.open_lab(browser, hub, USER, PASSWORD, clipboard=True)


def progress_text(page, job_id):
    row = page.locator(f'.gpulab-job[data-job-id="{job_id}"]')
    return row.locator(".gpulab-progress").inner_text()


def test_status_bar_and_panel_show_jobs_and_endpoints(
    browser, hub, tokens, artifacts_dir, tmp_path
):
    # A training job of the user's, slow enough to be seen running, and an endpoint:
    # both start (torch's import, a model server) while JupyterLab loads.
    job = submit(
        hub,
        tokens[USER],
        LINEAR,
        name="lab-visible",
        gpu_milli=250,
        env={"STEPS": "400", "STEP_DELAY": "0.5"},
    ).json()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    export_model(model.eval(), torch.randn(2, 4), str(tmp_path / "model"), name="m")
    Client(hub.api, token=tokens[USER]).create_deployment(
        str(tmp_path / "model"), {"name": ENDPOINT, "replicas": 1, "gpu_milli": 250}
    )
    # A job that fails at once (no GPU): its JobFailed alert is the status bar's badge.
    failing = submit(
        hub, tokens[USER], FAILS_ON_RANK_1, name="lab-fails", nproc_per_node=2, gpu_milli=0
    )
    assert failing.status_code == 201, failing.text
    context, page, errors = open_lab(browser, hub)

    # The status bar: the slice in words, from the server's own environment.
    status = page.locator(".gpulab-SliceStatus")
    expect(status.locator(".gpulab-SliceStatus-text")).to_have_text(
        "1/4 A100-80GB · 20 GiB · simulated", timeout=120_000
    )
    assert "held by: none: a simulated GPU" in status.get_attribute("title")
    bar = page.locator("#jp-main-statusbar").bounding_box()
    page.screenshot(
        path=os.path.join(artifacts_dir, "lab-statusbar.png"),
        clip={"x": 0, "y": bar["y"], "width": 600, "height": bar["height"]},
    )
    # Loading JupyterLab with the extension logs no error (a dialog would also block).
    assert not errors, errors
    expect(page.locator(".jp-Dialog")).to_have_count(0)

    wait_job(hub, tokens[USER], job["id"], states=("running",))

    # Clicking the status bar opens the panel on the slice: the status bar's words,
    # and what else of the user's holds GPU, each with its stop.
    status.click()
    panel = page.locator("#gpulab-panel")
    expect(panel).to_be_visible()
    held = panel.locator(".gpulab-Section-slice")
    expect(held.locator(".gpulab-slice-text")).to_have_text("1/4 A100-80GB · 20 GiB · simulated")
    expect(held).to_contain_text("held by: none: a simulated GPU")
    expect(held).to_contain_text("stopping this server does not stop them")
    expect(held.locator('.gpulab-held-job[data-name="lab-visible"]')).to_contain_text(
        "holds 1/4 GPU (1 rank)"
    )
    expect(held.locator(f'.gpulab-held-endpoint[data-name="{ENDPOINT}"]')).to_contain_text(
        "holds 1/4 GPU (1 replica)"
    )
    expect(held.locator(".gpulab-held-stop")).to_have_count(2)
    panel.screenshot(path=os.path.join(artifacts_dir, "lab-panel-slice.png"))

    panel.locator(".lm-TabBar-tab", has_text="Jobs").click()
    row = panel.locator(f'.gpulab-job[data-job-id="{job["id"]}"]')
    expect(row.locator(".gpulab-state")).to_have_text("running", timeout=60_000)
    expect(row.locator(".gpulab-name")).to_have_text("lab-visible")
    expect(row.locator(".gpulab-progress")).to_contain_text("/400", timeout=120_000)
    assert job["id"] not in progress_text(page, job["id"])  # jobs go by their names
    first = progress_text(page, job["id"])
    later = wait_until(
        lambda: (t := progress_text(page, job["id"])) != first and t,
        "the job's progress to move in the panel",
        120,
        detail=lambda: f"still {first!r}",
    )
    steps = [int(re.search(r"step (\d+)/400", t).group(1)) for t in (first, later)]
    assert steps[1] > steps[0], (first, later)

    # Its logs, fetched through the server's proxy.
    row.locator(".gpulab-logs-button").click()
    logs = row.locator(".gpulab-logs")
    expect(logs).to_be_visible()
    expect(logs).to_contain_text("[", timeout=60_000)
    assert "logs not available" not in logs.inner_text()
    panel.screenshot(path=os.path.join(artifacts_dir, "lab-panel-jobs.png"))

    # Cancel asks first; "Keep it running" keeps it, "Cancel job" cancels it.
    row.locator(".gpulab-cancel-button").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Cancel this job?")
    dialog.locator("button", has_text="Keep it running").click()
    expect(dialog).to_have_count(0)
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=tokens[USER]).json()["state"] == "running"
    row.locator(".gpulab-cancel-button").click()
    dialog.locator("button", has_text="Cancel job").click()
    expect(row.locator(".gpulab-state")).to_have_text("cancelled", timeout=120_000)
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=tokens[USER]).json()["state"] == (
        "cancelled"
    )

    # The endpoint of the user's: its URL and the curl line %deploy prints.
    panel.locator(".lm-TabBar-tab", has_text="Endpoints").click()
    endpoint = panel.locator(f'.gpulab-endpoint[data-name="{ENDPOINT}"]')
    url = f"{hub.url}/services/gpulab/endpoints/{USER}/{ENDPOINT}"
    expect(endpoint.locator(".gpulab-url")).to_have_text(url, timeout=60_000)
    expect(endpoint.locator(".gpulab-state")).to_have_text("running", timeout=240_000)
    expect(endpoint).to_contain_text("req/s")
    endpoint.locator(".gpulab-copy-curl").click()
    expect(endpoint.locator(".gpulab-copy-curl")).to_have_text("Copied")
    curl = page.evaluate("navigator.clipboard.readText()")
    assert curl.startswith('curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" '), curl
    assert curl.rstrip().endswith(f"{url}/v2/models/{ENDPOINT}/infer"), curl
    assert '"shape": [1, 4], "datatype": "FP32", "data": [0.0, 0.0, 0.0, 0.0]' in curl, curl
    # Try it: the request in the model's shapes, sent from the panel, the answer shown.
    endpoint.locator(".gpulab-try-open").click()
    request = endpoint.locator(".gpulab-try-body")
    expect(request).to_have_value(re.compile(r'"shape": \[1, 4\], "datatype": "FP32"'))
    endpoint.locator(".gpulab-try-send").click()
    answer = endpoint.locator(".gpulab-try-answer")
    expect(answer).to_contain_text("HTTP 200 in", timeout=60_000)
    expect(answer).to_contain_text("FP32 [1, 3]: [")
    request.fill(request.input_value().replace("[1, 4]", "[1, 5]"))
    endpoint.locator(".gpulab-try-send").click()
    expect(answer).to_contain_text("HTTP 400 in", timeout=60_000)
    expect(answer).to_contain_text("shape")  # the model server says what is wrong
    # That refusal was asked for: the browser logs it, as it logs any 400.
    refused = [e for e in errors if "/gpulab/try/" in e]
    assert len(refused) == 1 and refused[0].startswith("400 "), errors
    errors.remove(refused[0])
    errors.remove(
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    )
    panel.screenshot(path=os.path.join(artifacts_dir, "lab-panel-endpoints.png"))

    # Alerts, Usage and Pools answer in words (an empty state or rows), not an error.
    for tab, words in (
        ("Alerts", r"No alerts in the last 24 h|firing now"),
        ("Usage", r"GPU"),
        ("Pools", r"Jobs run on pool \w+\."),
    ):
        panel.locator(".lm-TabBar-tab", has_text=tab).click()
        section = panel.locator(f".gpulab-Section-{tab.lower()}")
        expect(section.locator(".gpulab-body")).to_contain_text(re.compile(words))
        expect(section.locator(".gpulab-problem")).to_be_hidden()
    # The pool's row: its GPUs and the free slices of each size.
    pools = panel.locator(".gpulab-Section-pools tr")
    expect(pools.nth(1)).to_contain_text(re.compile(r"local\s*local\s*\d+"))
    panel.screenshot(path=os.path.join(artifacts_dir, "lab-panel-pools.png"))

    # A section opens in the main area from the palette, where it can be docked.
    lab_pages.run_command(page, "gpulab: Open Jobs in a tab")
    docked = page.locator(".gpulab-MainArea")
    expect(docked.locator(f'.gpulab-job[data-job-id="{job["id"]}"]')).to_contain_text("cancelled")
    # Ended jobs are cleared from the list (this browser's), not from the API.
    wait_job(hub, tokens[USER], failing.json()["id"], states=("failed",))
    expect(docked.locator(".gpulab-clear-ended")).to_have_text("Clear 2 ended jobs")
    docked.locator(".gpulab-clear-ended").click()
    expect(docked.locator(".gpulab-job")).to_have_count(0)
    expect(docked).to_contain_text("No jobs to show: 2 ended jobs cleared.")
    assert len(hub.gpulab("GET", "/jobs", token=tokens[USER]).json()) == 2

    # The failed job's alert: a badge on the status bar and on the Alerts tab; a
    # click on the status bar then opens the alerts.
    badge = status.locator(".gpulab-alert-badge")
    expect(badge).to_have_text(re.compile(r"^[1-9]\d*$"), timeout=120_000)
    tab = f"Alerts ({badge.inner_text()})"
    expect(panel.locator(".lm-TabBar-tab", has_text=tab)).to_have_count(1)
    status.click()
    expect(panel.locator(".gpulab-Section-alerts")).to_contain_text("JobFailed")
    page.screenshot(
        path=os.path.join(artifacts_dir, "lab-statusbar-alert.png"),
        clip={"x": 0, "y": bar["y"], "width": 600, "height": bar["height"]},
    )
    assert not errors, errors
    listing_and_an_unsent_name(page, hub, tokens[USER], artifacts_dir)
    context.close()


def listing_and_an_unsent_name(page, hub, token, artifacts_dir):
    """``%deploy --list`` as a table that fits the cell, frozen once the next cell
    runs; a training cell's unsent notebook name refused at once, in the kernel."""
    page.goto(f"{hub.url}/user/{USER}/lab/tree/listing.ipynb")
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-CodeCell")
    cells.first.locator(".jp-InputArea-prompt").click()
    page.keyboard.press("Shift+Enter")
    table = cells.nth(0).locator("table.gpulab-deploy-list")
    expect(table).to_contain_text(ENDPOINT, timeout=60_000)
    expect(table).to_contain_text("running")
    area = cells.nth(0).locator(".jp-OutputArea-output").first.bounding_box()
    drawn = table.bounding_box()
    assert drawn["width"] <= area["width"], (drawn, area)  # no column wraps off the cell
    cells.nth(0).screenshot(path=os.path.join(artifacts_dir, "deploy-list.png"))

    jobs = len(hub.gpulab("GET", "/jobs", token=token).json())
    page.keyboard.press("Shift+Enter")  # class Net
    asked = time.monotonic()
    page.keyboard.press("Shift+Enter")  # the training cell
    said = cells.nth(2).locator(".jp-OutputArea-output")
    expect(said).to_contain_text("add `--vars Net`", timeout=60_000)
    print(f"the unsent-name hint showed {time.monotonic() - asked:.2f} s after Shift+Enter")
    assert len(hub.gpulab("GET", "/jobs", token=token).json()) == jobs  # nothing queued
    cells.nth(2).screenshot(path=os.path.join(artifacts_dir, "vars-hint.png"))
    # The listing stopped refreshing when the next cell ran: it keeps its moment.
    expect(cells.nth(0).locator(".jp-OutputArea-output")).to_contain_text(
        "no longer refreshing", timeout=30_000
    )
