"""Notebook jobs through Jupyter Scheduler's REST API in a real server of a real hub.

One hub for the module (`gpulab up`, two simulated A100s, real accounts when root),
whose service reads a clock this test can move (``support.file_clock``): a job
definition's schedule fires "tomorrow at 03:00" now, while its owner's server is
stopped. Everything else is real: JupyterHub, the servers with Jupyter Scheduler
and gpulab's scheduler in them, the service, the job's rank running the notebook
with a real kernel as the user's account.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
import requests
from hubproc import RunningHub, fresh_user
from support.file_clock import advance_to, config_lines
from support.wait import wait_until

from gpulab.enforcement.accounts import unix_name

pytestmark = pytest.mark.slow

ENV = "gpulab-python"


def notebook(*cells: tuple[str, list[str]]) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nbformat.writes(nb)


#: Trains nothing; says what it was given, as whom and on which slice, and writes a file.
TRAIN = notebook(
    ('epochs = 1\nlabel = "default"', ["parameters"]),
    (
        "import getpass, json, os\n"
        "seen = {'epochs': epochs, 'label': label, 'user': getpass.getuser(),\n"
        "        'gpu_milli': os.environ.get('GPULAB_GPU_MILLI')}\n"
        "open('metrics.json', 'w').write(json.dumps(seen))\n"
        "print('SEEN', json.dumps(seen))",
        [],
    ),
)
BROKEN = notebook(("rate = 0", ["parameters"]), ("steps = 10 // rate", []))
#: Runs until stopped.
LONG = notebook(("import time\nwhile True:\n    time.sleep(1)", []))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    data = tmp_path_factory.mktemp("notebook-jobs-hub")
    offset = data / "clock-offset"
    offset.write_text("0")
    config = config_lines(offset) + "c.GpuLabService.stop_work_on_exit = True\n"
    h = RunningHub(data, simulate="2xA100-80GB", config=config)
    h.clock_offset = offset
    yield h
    h.stop()


def server(hub, user: str, token: str, method: str, path: str, **kw) -> requests.Response:
    """A call to the user's server (its Jupyter Scheduler routes) with ``token``."""
    return requests.request(
        method,
        f"{hub.url}/user/{user}/scheduler/{path}",
        headers=hub.auth(token),
        timeout=120,
        allow_redirects=False,
        **kw,
    )


def notebook_job(notebook: str, name: str, **fields) -> dict:
    """A Jupyter Scheduler job (or job definition) body: ``notebook`` on a quarter GPU
    in gpulab's environment, its output notebook kept; ``fields`` add or replace."""
    return {
        "input_uri": notebook,
        "runtime_environment_name": ENV,
        "compute_type": "1/4 GPU",
        "output_formats": ["ipynb"],
        "name": name,
        **fields,
    }


def start(hub, user: str, files: dict[str, str]) -> str:
    token = hub.create_user(user)
    for name, text in files.items():
        hub.write_home_file(user, name, text)
    r = hub.spawn(user, {"gpu_milli": 250})
    assert r.status_code in (201, 202), r.text
    hub.wait_server(user)
    return token


def finished(hub, user, token, job_id) -> dict:
    def ended():
        job = server(hub, user, token, "GET", f"jobs/{job_id}").json()
        return job if job["status"] in ("COMPLETED", "FAILED", "STOPPED") else None

    return wait_until(ended, f"notebook job {job_id} to end", 400, every=1, detail=hub.log_tail)


def kernels_of(account: str) -> list[int]:
    """Pids of the kernels running as ``account``."""
    found = []
    for p in psutil.process_iter(["pid", "username", "cmdline"]):
        if p.info["username"] == account and "ipykernel" in " ".join(p.info["cmdline"] or []):
            found.append(p.info["pid"])
    return found


def output_notebook(hub, user: str, job: dict):
    (path,) = [f["file_path"] for f in job["job_files"] if f["file_format"] == "ipynb"]
    assert path, f"no output notebook written back: {job['job_files']}"
    return nbformat.read(hub.home(user) / path, as_version=4)


def test_a_parameterized_notebook_job_runs_on_a_slice_as_its_user(hub):
    alice = fresh_user("alice")
    token = start(hub, alice, {"train.ipynb": TRAIN})

    envs = server(hub, alice, token, "GET", "runtime_environments").json()
    (env,) = [e for e in envs if "gpulab" in e["name"]]
    assert "1/4 GPU" in env["compute_types"] and "1 GPU" in env["compute_types"]

    name = f"sweep-{alice}"
    body = notebook_job(
        "train.ipynb",
        name,
        runtime_environment_name=env["name"],
        parameters={"epochs": "3", "label": "nightly"},
        output_formats=["ipynb", "html"],
    )
    r = server(hub, alice, token, "POST", "jobs", json=body)
    assert r.status_code == 200, r.text
    job = finished(hub, alice, token, r.json()["job_id"])
    assert job["status"] == "COMPLETED", job

    # The output notebook: the injected cell right after the parameters cell, and the
    # run saw the job's values, as alice's account, on a quarter of a GPU.
    nb = output_notebook(hub, alice, job)
    assert nb.cells[0].metadata["tags"] == ["parameters"]
    assert nb.cells[1].metadata["tags"] == ["injected-parameters"]
    assert "epochs = 3" in nb.cells[1].source and "label = 'nightly'" in nb.cells[1].source
    printed = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    seen = json.loads(printed.split("SEEN ", 1)[1])
    user = unix_name(alice) if hub.accounts else None
    assert seen["epochs"] == 3 and seen["label"] == "nightly"
    assert seen["gpu_milli"] == "250"
    if user:
        assert seen["user"] == user
    # The HTML and the file the notebook wrote came back too.
    files = {f["file_format"]: f["file_path"] for f in job["job_files"]}
    assert files["html"] and (hub.home(alice) / files["html"]).read_text().startswith("<!DOCTYPE")
    assert files["files"], job["job_files"]
    assert json.loads((hub.home(alice) / files["files"] / "metrics.json").read_text()) == seen

    # The gpulab job: alice's, on a quarter GPU, named as the scheduler's job.
    (gj,) = [j for j in hub.gpulab("GET", "/jobs", token).json() if j["name"] == name]
    assert (gj["user"], gj["state"], gj["gpu_milli"]) == (alice, "succeeded", 250)


def test_a_failed_cell_is_in_the_output_notebook_and_the_status_message(hub):
    alice = fresh_user("alice")
    token = start(hub, alice, {"broken.ipynb": BROKEN})
    body = notebook_job("broken.ipynb", "broken")
    del body["compute_type"]  # the server's own slice
    r = server(hub, alice, token, "POST", "jobs", json=body)
    assert r.status_code == 200, r.text
    job = finished(hub, alice, token, r.json()["job_id"])
    assert job["status"] == "FAILED"
    assert "ZeroDivisionError" in job["status_message"], job["status_message"]
    nb = output_notebook(hub, alice, job)
    errors = [o for o in nb.cells[-1].outputs if o["output_type"] == "error"]
    assert errors and errors[0]["ename"] == "ZeroDivisionError"


def test_bob_can_neither_see_nor_stop_alices_notebook_job(hub):
    alice, bob = fresh_user("alice"), fresh_user("bob")
    token = start(hub, alice, {"long.ipynb": LONG})
    bob_token = hub.create_user(bob)
    name = f"private-{alice}"
    r = server(hub, alice, token, "POST", "jobs", json=notebook_job("long.ipynb", name))
    job_id = r.json()["job_id"]
    (gj,) = [j for j in hub.gpulab("GET", "/jobs", token).json() if j["name"] == name]

    # Through alice's server: it is hers, bob's token does not open it.
    for method, kw in (("GET", {}), ("PATCH", {"json": {"status": "STOPPED"}})):
        answer = server(hub, alice, bob_token, method, f"jobs/{job_id}", **kw)
        assert answer.status_code in (403, 404), (method, answer.status_code)
    assert server(hub, alice, bob_token, "GET", "jobs").status_code in (403, 404)
    # Through the service: her job does not exist for him, nor can he cancel it.
    assert hub.gpulab("GET", f"/jobs/{gj['id']}", bob_token).status_code == 404
    assert hub.gpulab("DELETE", f"/jobs/{gj['id']}", bob_token).status_code == 404
    assert gj["id"] not in [j["id"] for j in hub.gpulab("GET", "/jobs", bob_token).json()]
    assert hub.gpulab("GET", "/jobs", bob_token, params={"user": alice}).status_code == 403
    assert hub.gpulab("GET", f"/jobs/{gj['id']}", token).json()["state"] in ("queued", "running")

    # alice stops it (its kernel running): the gpulab job is cancelled, nothing of it
    # runs on.
    if hub.accounts:
        wait_until(lambda: kernels_of(unix_name(alice)), "the job's kernel to start", 300)
    r = server(hub, alice, token, "PATCH", f"jobs/{job_id}", json={"status": "STOPPED"})
    assert r.status_code == 204, r.text
    assert finished(hub, alice, token, job_id)["status"] == "STOPPED"
    assert hub.gpulab("GET", f"/jobs/{gj['id']}", token).json()["state"] == "cancelled"
    if hub.accounts:  # nothing of the job runs on, its kernel included
        assert (
            wait_until(lambda: not kernels_of(unix_name(alice)), "the job's kernel to end", 30)
            is True
        )


def test_a_scheduled_job_definition_runs_while_the_server_is_stopped(hub):
    alice, bob = fresh_user("alice"), fresh_user("bob")
    token = start(hub, alice, {"train.ipynb": TRAIN})
    bob_token = hub.create_user(bob)
    name = f"nightly-{alice}"
    body = notebook_job(
        "train.ipynb",
        name,
        parameters={"label": "scheduled"},
        schedule="0 3 * * *",
        timezone="UTC",
    )
    r = server(hub, alice, token, "POST", "job_definitions", json=body)
    assert r.status_code == 200, r.text
    definition_id = r.json()["job_definition_id"]
    (sched,) = [s for s in hub.gpulab("GET", "/schedules", token).json() if s["name"] == name]
    due = dt.datetime.fromisoformat(sched["next_run"])
    assert (due.hour, due.minute) == (3, 0)
    # bob sees nothing of it and cannot delete it.
    assert hub.gpulab("GET", f"/schedules/{sched['id']}", bob_token).status_code == 404
    assert hub.gpulab("DELETE", f"/schedules/{sched['id']}", bob_token).status_code == 404

    # alice's server stops; 03:00 comes (the service's clock).
    assert hub.hub_api("DELETE", f"/users/{alice}/server").status_code in (202, 204)
    hub.wait_server(alice, ready=False)
    advance_to(hub.clock_offset, due + dt.timedelta(seconds=1))

    def ran():
        jobs = [j for j in hub.gpulab("GET", "/jobs", token).json() if j["name"] == name]
        return jobs[0] if jobs and jobs[0]["state"] in ("succeeded", "failed") else None

    gj = wait_until(ran, "the scheduled job to run", 400, every=1, detail=hub.log_tail)
    assert gj["state"] == "succeeded", gj
    assert not hub.hub_api("GET", f"/users/{alice}").json()["servers"], "the server stayed off"
    runs = hub.gpulab("GET", f"/schedules/{sched['id']}/runs", token).json()
    assert [run["job_id"] for run in runs] == [gj["id"]]

    # Back in the lab: the run is listed under its definition, its output written back.
    hub.spawn(alice, {"gpu_milli": 250})
    hub.wait_server(alice)
    listed = server(hub, alice, token, "GET", "jobs", params={"job_definition_id": definition_id})
    (job,) = listed.json()["jobs"]
    job = finished(hub, alice, token, job["job_id"])
    assert (job["status"], job["name"]) == ("COMPLETED", name)
    printed = "".join(o.get("text", "") for o in output_notebook(hub, alice, job).cells[2].outputs)
    assert json.loads(printed.split("SEEN ", 1)[1])["label"] == "scheduled"

    # Paused in the lab, paused in the service; deleted, gone from both.
    path = f"job_definitions/{definition_id}"
    r = server(hub, alice, token, "PATCH", path, json={"active": False})
    assert r.status_code == 204, r.text
    assert hub.gpulab("GET", f"/schedules/{sched['id']}", token).json()["active"] is False
    assert server(hub, alice, token, "DELETE", path).status_code == 204
    assert hub.gpulab("GET", f"/schedules/{sched['id']}", token).status_code == 404


@pytest.fixture(scope="module")
def browser():
    # Module scope, as tests/browser's: Playwright's sync API keeps a loop in this thread.
    from playwright.sync_api import sync_playwright
    from support.chromium import CHROMIUM_ARGS

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.mark.browser
def test_the_labs_notebook_jobs_panel_lists_a_job_that_ran_on_a_slice(hub, browser, artifacts_dir):
    """Jupyter Scheduler's prebuilt labextension (in its wheel) in gpulab's lab: the
    Notebook Jobs panel lists the job, completed, in the gpulab environment."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "browser"))
    import lab_pages
    from playwright.sync_api import expect

    user, password = fresh_user("lab-jobs"), "notebook jobs long password"
    token = lab_pages.lab_user(hub, user, password)
    hub.write_home_file(user, "train.ipynb", TRAIN)
    name = f"panel-{user}"
    body = notebook_job("train.ipynb", name, parameters={"label": "from-the-panel"})
    r = server(hub, user, token, "POST", "jobs", json=body)
    assert finished(hub, user, token, r.json()["job_id"])["status"] == "COMPLETED"

    context, page, errors = lab_pages.open_lab(browser, hub, user, password)
    try:
        # The launcher's card of Jupyter Scheduler's panel ("Jobs", under Other).
        page.locator(".jp-LauncherCard").get_by_text("Jobs", exact=True).click()
        row = page.get_by_role("row").filter(has_text=name)
        expect(row).to_be_visible()
        expect(row).to_contain_text("Completed")
        page.screenshot(path=str(Path(artifacts_dir) / "notebook-jobs-panel.png"))
    finally:
        context.close()
    assert not [e for e in errors if "scheduler" in e], errors
