"""The hub's pages about slices, on the real shared hub: the progress events of a spawn
through JupyterHub's REST progress API, and the gpulab page in a real Chromium with the
hub's look, a real torchrun job and a real model-server deployment listed by name."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest
import requests
import torch
from cells import SLEEPS
from hubproc import fresh_user
from logins import admin_password, browser_log_in, log_in, sign_up_approved
from playwright.sync_api import expect
from support.wait import wait_until

from gpulab.client import Client
from gpulab.serving.export import export_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER = fresh_user("pages")


@pytest.fixture(scope="module")
def token(plain_hub):
    return plain_hub.create_user(USER)


def progress_events(hub, user: str) -> list[dict]:
    """Read ``/hub/api/users/{user}/server/progress`` (server-sent events) to the end."""
    events = []
    with requests.get(
        f"{hub.url}/hub/api/users/{user}/server/progress",
        headers=hub.auth(),
        stream=True,
        timeout=300,
    ) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[len("data:") :])
                events.append(event)
                if event.get("ready") or event.get("failed"):
                    break
    return events


def test_progress_api_says_where_the_slice_went(hub, token):
    answers = []
    spawn = threading.Thread(target=lambda: answers.append(hub.spawn(USER, {"gpu_milli": 100})))
    spawn.start()

    def pending():
        server = (hub.hub_api("GET", f"/users/{USER}").json().get("servers") or {}).get("")
        return server if server and (server.get("pending") or server.get("ready")) else None

    assert wait_until(pending, f"{USER}'s spawn to begin", 120).get("pending") == "spawn", (
        "the server was ready before the progress API could be read"
    )
    messages = [e.get("message", "") for e in progress_events(hub, USER)]
    spawn.join()
    assert answers[0].status_code in (201, 202), answers[0].text
    text = "\n".join(messages)
    placed = re.search(r"Placed 1/10 GPU on A100-80GB #([01]) of node (\S+) \(8 GiB\)", text)
    assert placed, text
    row = hub.gpulab("GET", "/allocations", params={"user": USER}).json()[0]
    assert (int(placed.group(1)), placed.group(2)) == (row["gpu_index"], row["node"])
    enforced = [m for m in messages if m.startswith("Enforced by: ")]
    assert enforced and "PyTorch memory limit + CUDA_VISIBLE_DEVICES" in enforced[0], text
    assert enforced[0].endswith("(simulated GPU: nothing enforced)"), text
    # In the order they happen, before the hub's own "ready".
    order = [messages.index(m) for m in (placed.group(0), enforced[0], "Starting JupyterLab…")]
    assert order == sorted(order), text
    hub.wait_server(USER)


def test_service_page_lists_jobs_and_endpoints_by_name(
    hub, token, browser, artifacts_dir, tmp_path
):
    r = hub.gpulab(
        "POST",
        "/jobs",
        token=token,
        json={"code": SLEEPS, "name": "browser-train", "gpu_milli": 100},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    export_model(model, torch.randn(2, 4), str(model_dir), name="m", max_batch_size=4)
    dep = Client(hub.api, token=token).create_deployment(
        str(model_dir), {"name": "tiny-linear", "gpu_milli": 100}
    )

    def all_running():
        j = hub.gpulab("GET", f"/jobs/{job['id']}", token=token).json()
        d = hub.gpulab("GET", "/deployments/tiny-linear", token=token).json()
        if j["state"] in ("failed", "cancelled", "succeeded"):
            raise AssertionError(f"the job ended: {j}")
        return j["state"] == "running" and d.get("replicas_ready") == 1

    wait_until(all_running, "the job running and the endpoint ready", 300, detail=hub.log_tail)
    owners = [a["owner"] for a in hub.gpulab("GET", "/allocations", token=token).json()]

    page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
    page.set_default_timeout(120_000)
    browser_log_in(page, hub, "admin", admin_password(hub))
    page.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    styles = []
    page.on(
        "response",
        lambda resp: styles.append(resp.status) if resp.url.endswith("style.min.css") else None,
    )
    page.goto(f"{hub.url}/services/gpulab/")
    # The hub's look: its navigation bar and its stylesheet, served by the hub.
    expect(page.locator("nav.navbar")).to_contain_text("Home")
    expect(page.locator("nav.navbar")).to_contain_text("Admin")
    assert styles and styles[0] == 200
    assert (
        page.evaluate("getComputedStyle(document.querySelector('table')).borderCollapse")
        == "collapse"
    )

    allocations = page.locator("table.gpulab-allocations")
    expect(allocations).to_contain_text(f"{USER}'s server")
    expect(allocations).to_contain_text("job browser-train (rank 0)")
    expect(allocations).to_contain_text("tiny-linear version 1 (replica 0)")
    expect(allocations).to_contain_text("1/10 GPU")
    for owner in owners:
        if not owner.startswith(f"{USER}/"):
            expect(allocations).not_to_contain_text(owner)
    job_row = page.locator(f"#job-{job['id']}")
    expect(job_row).to_contain_text("browser-train")
    expect(job_row).to_contain_text("running")
    expect(job_row).to_contain_text(USER)
    submitted = job_row.locator("time")
    expect(submitted).to_have_text(re.compile(r"just now|\d+ min ago"))
    assert re.match(r"\d{4}-\d\d-\d\dT", submitted.get_attribute("title"))
    endpoint = page.locator(f"#endpoint-{dep['id']}")
    expect(endpoint).to_contain_text("tiny-linear")
    expect(endpoint).to_contain_text(f"/services/gpulab/endpoints/{USER}/tiny-linear")
    expect(endpoint).to_contain_text("1 / 1")
    expect(page.locator("body")).not_to_contain_text("milli")
    page.screenshot(path=os.path.join(artifacts_dir, "service-page.png"), full_page=True)

    # Sharing from the page (an admin may, for the owner): a bad name is refused in
    # the form with the reason; a good one is saved, and the sharee's page lists it.
    sharee = fresh_user("sharee")
    sharee_token = hub.create_user(sharee)
    expect(endpoint.locator(".gpulab-shared-with")).to_contain_text("only its owner")
    endpoint.get_by_role("button", name="Share…").click()
    form = page.locator(f"#share-{dep['id']} form")
    form.get_by_label("Users").fill("not a name")
    form.get_by_role("button", name="Save").click()
    expect(form.locator(".gpulab-share-error")).to_contain_text(
        "Not shared: 'not a name' is not a user name"
    )
    form.get_by_label("Users").fill(sharee)
    page.screenshot(path=os.path.join(artifacts_dir, "service-page-share.png"))
    form.get_by_role("button", name="Save").click()
    expect(page.locator(f"#endpoint-{dep['id']} .gpulab-shared-with")).to_contain_text(sharee)
    page.close()
    assert hub.gpulab("GET", "/deployments/tiny-linear", token=token).json()["share_users"] == [
        sharee
    ]
    r = requests.get(f"{hub.url}/services/gpulab/", headers=hub.auth(sharee_token), timeout=60)
    assert r.status_code == 200, r.text
    shared = re.search(rf'<tr id="shared-{dep["id"]}">(.*?)</tr>', r.text, re.S)
    assert shared and "tiny-linear" in shared.group(1) and USER in shared.group(1)


HOLDER = fresh_user("holder")


def test_the_home_page_says_what_else_the_user_holds_and_stops_it(
    hub, browser, artifacts_dir, tmp_path
):
    """ "Stop My Server" leaves endpoints and jobs holding their GPU: the home page says
    so, and its "Stop them too" stops them (the user's own only)."""
    password = "held-elsewhere-1"
    sign_up_approved(hub, HOLDER, password)
    token = hub.create_user(HOLDER)
    hub.spawn_ready({HOLDER: {"gpu_milli": 0}})
    r = hub.gpulab(
        "POST", "/jobs", token=token, json={"code": SLEEPS, "name": "held-train", "gpu_milli": 100}
    )
    assert r.status_code == 201, r.text
    job = r.json()
    model_dir = tmp_path / "model"
    export_model(
        torch.nn.Linear(4, 3).eval(), torch.randn(2, 4), str(model_dir), name="m", max_batch_size=4
    )
    Client(hub.api, token=token).create_deployment(
        str(model_dir), {"name": "held-linear", "gpu_milli": 100}
    )
    wait_until(
        lambda: (
            hub.gpulab("GET", f"/jobs/{job['id']}", token=token).json()["state"] == "running"
            and hub.gpulab("GET", "/deployments/held-linear", token=token).json()["replicas_ready"]
            == 1
        ),
        "the job running and the endpoint ready",
        300,
        detail=hub.log_tail,
    )

    # Without a login, nothing; another user sees only their own (none).
    anonymous = requests.get(f"{hub.url}/hub/gpulab/held", allow_redirects=False, timeout=30)
    assert anonymous.status_code in (302, 403), anonymous.status_code
    admin = log_in(hub, "admin", admin_password(hub))
    theirs = admin.get(f"{hub.url}/hub/gpulab/held", timeout=30).json()
    assert all(i["user"] == "admin" for i in theirs["items"]), theirs
    # A POST without the page's XSRF token (another site's form) stops nothing.
    forged = log_in(hub, HOLDER, password).post(f"{hub.url}/hub/gpulab/held", timeout=30)
    assert forged.status_code == 403, forged.text

    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.set_default_timeout(120_000)
    browser_log_in(page, hub, HOLDER, password)
    page.wait_for_url(re.compile(r".*/(hub|user)/.*"))
    page.goto(f"{hub.url}/hub/home")
    held = page.locator("#gpulab-held")
    expect(held).to_be_visible()
    expect(held).to_contain_text("These keep running when your server stops, holding 1/5 GPU:")
    expect(held).to_contain_text("endpoint held-linear (1/10 GPU, running)")
    expect(held).to_contain_text("job held-train (1/10 GPU, running)")
    # The hub's own stop: the server goes, the box stays. Its button works once the
    # page's scripts are in (in one CI run the click made no stop call): wait for
    # them, then for the stop call the click makes.
    page.wait_for_load_state("networkidle")
    with page.expect_response(
        lambda r: (
            r.request.method == "DELETE" and r.url.split("?")[0].endswith(f"/users/{HOLDER}/server")
        )
    ):
        page.click("#stop")
    hub.wait_server(HOLDER, ready=False)
    expect(held).to_contain_text("endpoint held-linear")
    page.screenshot(path=os.path.join(artifacts_dir, "home-held.png"), full_page=True)

    page.click("#gpulab-stop-held")
    # (The job's ranks get their grace to stop.)
    expect(held).to_contain_text("Stopped endpoint held-linear, job held-train.", timeout=90_000)
    page.screenshot(path=os.path.join(artifacts_dir, "home-held-stopped.png"), full_page=True)
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=token).json()["state"] == "cancelled"
    assert hub.gpulab("GET", "/deployments/held-linear", token=token).status_code == 404
    assert all(
        not a["owner"].startswith(f"{HOLDER}/")
        for a in hub.gpulab("GET", "/allocations", token=token).json()
    )
    page.goto(f"{hub.url}/hub/home")
    expect(page.locator("#gpulab-stop-held")).to_be_attached()
    page.wait_for_load_state("networkidle")
    expect(held).to_be_hidden()  # nothing held: nothing said
    page.close()
