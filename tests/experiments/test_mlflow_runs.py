"""Experiments in MLflow, on the session's real hub: a ``%%train_distributed`` cell of
alice's is a run in MLflow, found by the unmodified ``mlflow`` client with her hub
token (``MLFLOW_TRACKING_TOKEN``) at ``<hub>/services/mlflow``, with its loss, flags
and code; bob's token neither sees nor writes it; no token is refused; and the MLflow
UI opens through the hub in a real Chromium, her run in it.

The client runs in a process of its own, as a user's would: only the two environment
variables tell it where MLflow is and who asks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from urllib.parse import urlsplit

import nbformat
import pytest
import requests
from hubproc import fresh_user
from logins import browser_log_in, sign_up_approved
from nbclient import NotebookClient
from playwright.sync_api import expect, sync_playwright
from support.chromium import CHROMIUM_ARGS
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE = fresh_user("alice-ml")
BOB = fresh_user("bob-ml")
PASSWORD = "mlflow-runs-password-1"
LOSSES = [1.0 / (step + 1) for step in range(5)]
CELL = textwrap.dedent(
    """\
    %%train_distributed --nproc-per-node 1 --out model
    import torch
    from gpulab.training import report

    model = torch.nn.Linear(4, 1)
    for step in range(5):
        report(loss=1.0 / (step + 1))
    """
)


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


@pytest.fixture(scope="module")
def tokens(hub):
    sign_up_approved(hub, ALICE, PASSWORD)  # she opens the UI in a browser too
    return {ALICE: hub.create_user(ALICE), BOB: hub.create_user(BOB)}


def tracking_uri(hub) -> str:
    return f"{hub.url}/services/mlflow"


def mlflow_client(hub, token: str | None, script: str) -> dict:
    """Run ``script`` (which prints one JSON line) with the stock mlflow client."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_TRACKING_URI"] = tracking_uri(hub)
    if token:
        env["MLFLOW_TRACKING_TOKEN"] = token
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def alice_job(hub, tokens, tmp_path_factory):
    """Alice's cell run from a notebook kernel as her server's would; her job's row."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext gpulab.magics"),
        nbformat.v4.new_code_cell(CELL),
    ]
    folder = tmp_path_factory.mktemp("mlflow-notebook")
    # The kernel's environment as her server's: the API and her token.
    kernel_env = {"GPULAB_API_URL": hub.api, "JUPYTERHUB_API_TOKEN": tokens[ALICE]}
    saved = {k: os.environ.get(k) for k in kernel_env}
    os.environ.update(kernel_env)
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
        ).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    said = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    assert "succeeded" in said, said
    jobs = hub.gpulab("GET", "/jobs", token=tokens[ALICE]).json()
    jobs = jobs.get("jobs", jobs) if isinstance(jobs, dict) else jobs
    [job] = [j for j in jobs if j["user"] == ALICE]
    return job


@pytest.fixture(scope="module")
def alice_run(hub, tokens, alice_job):
    """The job's run, once the service has written it (it does when the job ends)."""
    api = f"{tracking_uri(hub)}/api/2.0/mlflow"
    auth = {"Authorization": f"Bearer {tokens[ALICE]}"}

    def written():
        exps = requests.get(f"{api}/experiments/search?max_results=100", headers=auth, timeout=60)
        ids = [e["experiment_id"] for e in exps.json().get("experiments", [])]
        if not ids:
            return None
        found = requests.post(
            f"{api}/runs/search",
            headers=auth,
            timeout=60,
            json={
                "experiment_ids": ids,
                "filter": f"tags.`gpulab.job_id` = '{alice_job['id']}'",
            },
        ).json()
        runs = [r for r in found.get("runs", []) if r["info"]["status"] == "FINISHED"]
        return runs[0] if runs else None

    return wait_until(written, f"job {alice_job['id']} as a finished MLflow run", timeout=300)


def test_alice_lists_the_run_of_her_cell_with_its_loss(hub, tokens, alice_job, alice_run):
    seen = mlflow_client(
        hub,
        tokens[ALICE],
        f"""
        import json, mlflow
        from mlflow import MlflowClient

        client = MlflowClient()
        exps = client.search_experiments()
        runs = client.search_runs([e.experiment_id for e in exps])
        [run] = [r for r in runs if r.data.tags.get("gpulab.job_id") == {alice_job["id"]!r}]
        code = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="code/cell.py"
        )
        print(json.dumps({{
            "experiments": [e.name for e in exps],
            "run_id": run.info.run_id,
            "status": run.info.status,
            "loss": [m.value for m in client.get_metric_history(run.info.run_id, "loss")],
            "params": run.data.params,
            "model": [f.path for f in client.list_artifacts(run.info.run_id, "model")],
            "code": open(code).read(),
        }}))
        """,
    )
    assert seen["run_id"] == alice_run["info"]["run_id"]
    assert seen["experiments"] == [f"{ALICE}/jobs"], seen["experiments"]
    assert seen["status"] == "FINISHED"
    assert seen["loss"] == pytest.approx(LOSSES)
    assert seen["params"]["nproc_per_node"] == "1" and seen["params"]["out"] == "model"
    assert seen["model"] == ["model/state_dict.pt"]
    assert "report(loss=1.0 / (step + 1))" in seen["code"]
    # Nothing of the job's environment is a param (a --env may carry a secret).
    assert "env" not in seen["params"]
    # The job itself names its run (a deployed model's lineage carries it on).
    job = hub.gpulab("GET", f"/jobs/{alice_job['id']}", token=tokens[ALICE]).json()
    assert job["mlflow_run_id"] == alice_run["info"]["run_id"]


def test_bob_neither_sees_nor_writes_alices_run(hub, tokens, alice_run):
    run_id = alice_run["info"]["run_id"]
    experiment_id = alice_run["info"]["experiment_id"]
    seen = mlflow_client(
        hub,
        tokens[BOB],
        f"""
        import json, mlflow
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        client = MlflowClient()

        def refused(call):
            try:
                call()
            except MlflowException as e:
                return e.error_code
            return "allowed"

        # His own experiment and run, in a name alice could use too.
        mlflow.set_experiment("demo")
        with mlflow.start_run() as own:
            mlflow.log_metric("loss", 0.5)
        print(json.dumps({{
            "experiments": [e.name for e in client.search_experiments()],
            "get": refused(lambda: client.get_run({run_id!r})),
            "log": refused(lambda: client.log_metric({run_id!r}, "loss", 99.0)),
            "tag": refused(lambda: client.set_tag({run_id!r}, "stolen", "yes")),
            "search": refused(lambda: client.search_runs([{experiment_id!r}])),
            "history": refused(lambda: client.get_metric_history({run_id!r}, "loss")),
            "artifacts": refused(lambda: client.list_artifacts({run_id!r})),
            "own_run": client.get_run(own.info.run_id).data.metrics,
        }}))
        """,
    )
    assert seen["experiments"] == [f"{BOB}/demo"], seen["experiments"]
    assert seen["own_run"] == {"loss": 0.5}
    for what in ("get", "log", "tag", "search", "history", "artifacts"):
        assert seen[what] == "RESOURCE_DOES_NOT_EXIST", (what, seen)
    # Nothing of his reached her run.
    after = mlflow_client(
        hub,
        tokens[ALICE],
        f"""
        import json
        from mlflow import MlflowClient
        run = MlflowClient().get_run({run_id!r})
        print(json.dumps({{"loss": run.data.metrics["loss"], "tags": run.data.tags}}))
        """,
    )
    assert after["loss"] == pytest.approx(LOSSES[-1]) and "stolen" not in after["tags"]


def test_the_artifact_store_is_closed_to_another_user(hub, tokens, alice_run):
    """MLflow serves artifacts by path (``<experiment>/<run>/artifacts/...``): bob can
    neither read alice's code nor write beside it."""
    artifacts = alice_run["info"]["artifact_uri"].split("mlflow-artifacts:/", 1)[1]
    url = f"{tracking_uri(hub)}/api/2.0/mlflow-artifacts/artifacts/{artifacts}/code/cell.py"
    bob = {"Authorization": f"Bearer {tokens[BOB]}"}
    assert requests.get(url, headers=bob, timeout=60).status_code == 404
    assert requests.put(url, headers=bob, data=b"print('bob')", timeout=60).status_code == 404
    alice = {"Authorization": f"Bearer {tokens[ALICE]}"}
    assert b"report(loss=" in requests.get(url, headers=alice, timeout=60).content


def test_the_uis_upload_takes_a_binary_file_for_its_owners_run_only(hub, tokens, alice_run):
    """The UI's upload-artifact sits under the API's root; its body is the file."""
    ajax = f"{tracking_uri(hub)}/ajax-api/2.0/mlflow/upload-artifact"
    where = {"run_uuid": alice_run["info"]["run_id"], "path": "notes/weights.bin"}
    data = bytes(range(256)) * 64  # not JSON, not UTF-8
    bob = {"Authorization": f"Bearer {tokens[BOB]}"}
    assert requests.post(ajax, params=where, headers=bob, data=data, timeout=60).status_code == 404
    alice = {"Authorization": f"Bearer {tokens[ALICE]}"}
    r = requests.post(ajax, params=where, headers=alice, data=data, timeout=60)
    assert r.status_code == 200, r.text
    artifacts = alice_run["info"]["artifact_uri"].split("mlflow-artifacts:/", 1)[1]
    url = f"{tracking_uri(hub)}/api/2.0/mlflow-artifacts/artifacts/{artifacts}/notes/weights.bin"
    assert requests.get(url, headers=alice, timeout=60).content == data


def test_without_a_token_nothing_answers(hub, tokens):
    api = f"{tracking_uri(hub)}/api/2.0/mlflow"
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        r = requests.get(f"{api}/experiments/search", headers=headers, timeout=60)
        assert r.status_code in (401, 403), r.text
        assert "error" in r.json()
    # The stock client says so too.
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mlflow; mlflow.MlflowClient().search_experiments()",
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
            "MLFLOW_TRACKING_URI": tracking_uri(hub),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and "set MLFLOW_TRACKING_TOKEN" in r.stderr, r.stderr[-2000:]


def _headers_only(hub, method: str, path: str, headers: dict) -> str:
    """The status line answered to a request that says a body is coming and sends only
    its first 64 KiB (the hub's proxy passes the headers on with the first bytes): what
    the service decides before reading the body."""
    url = urlsplit(f"{tracking_uri(hub)}/{path}")
    lines = [
        f"{method} {url.path} HTTP/1.1",
        f"Host: {url.netloc}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b"x" * (64 << 10))
        return sock.recv(4096).decode(errors="replace").split("\r\n", 1)[0]


def test_a_body_is_judged_by_who_sends_it_before_it_is_read(hub, tokens, alice_run):
    """The proxy took up to 1 GiB of anyone's body into memory before asking the hub
    who sent it. A refused body is now read and dropped, then answered (closing with it
    unread makes the hub's proxy answer its own 503); one claiming far more than the
    route takes is answered at once."""
    artifacts = alice_run["info"]["artifact_uri"].split("mlflow-artifacts:/", 1)[1]
    upload = f"api/2.0/mlflow-artifacts/artifacts/{artifacts}/big.bin"
    url = f"{tracking_uri(hub)}/{upload}"
    # No token: the refusal, whatever the body (its 3 MiB dropped, not kept).
    r = requests.put(url, data=os.urandom(3 << 20), timeout=120)
    assert r.status_code == 401 and "MLFLOW_TRACKING_TOKEN" in r.json()["message"]
    # One claiming 4 GiB is answered before it is sent (the proxy may say 503 for the
    # service, which hung up on the rest).
    huge = {"Content-Length": str(4 << 30), "Content-Type": "application/octet-stream"}
    assert _headers_only(hub, "PUT", upload, huge).split()[1] in ("401", "503")
    # A JSON call of MLflow's API is held to 16 MiB, even for its owner.
    alice = {"Authorization": f"Bearer {tokens[ALICE]}"}
    call = f"{tracking_uri(hub)}/api/2.0/mlflow/runs/log-batch"
    r = requests.post(call, headers=alice, data=b" " * (17 << 20), timeout=120)
    assert r.status_code == 413 and "16 MiB" in r.json()["message"]
    # Her artifact of a few MiB (kept in a file on the way) arrives whole.
    data = os.urandom(3 << 20)
    assert requests.put(url, headers=alice, data=data, timeout=120).status_code == 200
    assert requests.get(url, headers=alice, timeout=120).content == data


def test_what_the_proxy_cannot_check_is_refused(hub, tokens):
    """Parts of MLflow gpulab does not offer answer 403 with the reason, for users."""
    alice = {"Authorization": f"Bearer {tokens[ALICE]}"}
    for method, path in (
        ("GET", "api/2.0/mlflow/registered-models/search"),
        ("POST", "graphql"),
        ("GET", "api/3.0/mlflow/gateway/secrets/list"),
    ):
        r = requests.request(method, f"{tracking_uri(hub)}/{path}", headers=alice, timeout=60)
        assert r.status_code == 403 and "not offered" in r.json()["error"], (path, r.text)


@pytest.mark.browser
def test_the_mlflow_ui_opens_through_the_hub(hub, tokens, alice_run, artifacts_dir):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            browser_log_in(page, hub, ALICE, PASSWORD)
            page.goto(f"{tracking_uri(hub)}/")
            expect(page.get_by_text(f"{ALICE}/jobs").first).to_be_visible(timeout=120_000)
            exp = alice_run["info"]["experiment_id"]
            page.goto(f"{tracking_uri(hub)}/#/experiments/{exp}/runs/{alice_run['info']['run_id']}")
            expect(page.get_by_text(alice_run["info"]["run_name"]).first).to_be_visible(
                timeout=120_000
            )
            # MLflow's assistant panel (it wants an LLM provider) closed, as a user would.
            assistant = page.get_by_text("MLflow Assistant").first
            if assistant.is_visible():
                page.locator("[data-component-id*='chat_panel.close']").first.click()
            # Her run's loss, charted by MLflow's own UI.
            page.get_by_role("tab", name="Model metrics").click()
            expect(page.get_by_text("loss").first).to_be_visible(timeout=60_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
            page.screenshot(path=os.path.join(artifacts_dir, "mlflow-ui-run.png"))
        finally:
            browser.close()


def test_servers_reach_mlflow_with_their_users_own_token(hub, tokens):
    assert hub.spawn(BOB, {"gpu_milli": 0}, token=tokens[BOB]).status_code in (201, 202)
    hub.wait_server(BOB)
    env = hub.server_env(BOB)
    assert env["MLFLOW_TRACKING_URI"] == tracking_uri(hub)
    # The server's own token (its user's), never one of the platform's.
    token = env["MLFLOW_TRACKING_TOKEN"]
    assert token == env["JUPYTERHUB_API_TOKEN"]
    assert token not in {
        (hub.data_dir / n).read_text().strip() for n in ("service-token", "mlflow-token")
    }
    r = requests.get(
        f"{tracking_uri(hub)}/api/2.0/mlflow/experiments/search?max_results=100",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    # His own experiments only (none of alice's).
    assert all(e["name"].startswith(f"{BOB}/") for e in r.json().get("experiments", []))
