"""Hibernation end to end: a real hub, real servers and kernels, real accounts.

alice's notebook holds a trained torch model, a numpy array, a pandas frame, a plotly
figure, a lambda, a generator and an open file. She hibernates: her kernel saves
itself to her files, her server stops and her quarter GPU goes back (the ledger,
the allocations, usage). She starts again on half a GPU and opens the notebook: the
model's weights, the array and the frame are equal to before, and the first cell
says the generator and the file did not come back, and why. bob reads nothing of it.

Then the scheduler: alice's idle server and bob's batch job fill both GPUs; carol's
server hibernates alice (not bob's job) and starts; alice wakes later with her state.

Only the GPUs are declared (simulated A100s): nothing here needs one.
"""

from __future__ import annotations

import datetime as dt
import pwd
import subprocess
import time

import pytest
import requests
from hubproc import RunningHub, fresh_user
from support.notebook_kernel import NotebookKernel
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = fresh_user("alice"), fresh_user("bob"), fresh_user("carol")
DAVE = fresh_user("dave")
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep

# The scheduler may hibernate a server idle for 2 s (the default is 5 min): the test
# need not wait minutes for alice's notebook to count as idle.
CONFIG = """
c.Hibernation.hibernate_for_others_seconds = 2
c.JobQueue.preemption_grace_seconds = 10
# Small, so that one test's notebook can hold more than is kept.
c.Hibernation.hibernate_max_bytes = 50 * 10**6
"""

NOTEBOOK = [
    """
import os, hashlib
import numpy as np, pandas as pd, torch
import plotly.graph_objects as go

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
for _ in range(5):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
""",
    """
arr = np.random.default_rng(1).standard_normal((500, 200))
df = pd.DataFrame({"city": ["Oslo", "Lima", "Pune"] * 100, "t": np.arange(300) / 7})
fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 1, 2]))
square = lambda v: v * v
gen = (i * i for i in range(10))
notes = open(os.path.expanduser("~/notes.txt"), "w")
""",
]

FINGERPRINT = """
def _digest():
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().numpy().tobytes())
    h.update(arr.tobytes())
    h.update(pd.util.hash_pandas_object(df).values.tobytes())
    return h.hexdigest()
print("DIGEST", _digest(), float(loss))
"""


def until(what, check, timeout=WAIT_S):
    return wait_until(check, what, timeout)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("hibernate-hub"), config=CONFIG)
    yield h
    h.stop()


def hibernated(hub, token, hid) -> dict:
    return until(
        f"hibernation {hid} to end",
        lambda: (
            (row := hub.gpulab("GET", f"/hibernations/{hid}", token=token).json())["state"]
            in ("hibernated", "failed")
            and row
        ),
    )


def server_slices(hub, user) -> list[dict]:
    rows = hub.gpulab("GET", "/allocations", params={"user": user}).json()
    return [r for r in rows if r["owner_kind"] == "server"]


def digest_of(out: str) -> str:
    line = next(ln for ln in out.splitlines() if ln.startswith("DIGEST "))
    return line.split()[1]


def test_hibernate_and_wake_on_another_slice(hub):
    alice, bob = hub.create_user(ALICE), hub.create_user(BOB)
    hub.spawn_ready({ALICE: {"gpu_milli": 250}, BOB: {"gpu_milli": 250}})
    server = f"{hub.url}/user/{ALICE}"
    nb = NotebookKernel(server, alice, "analysis.ipynb")
    for cell in NOTEBOOK:
        nb.run(cell)
    before = digest_of(nb.run(FINGERPRINT))
    assert server_slices(hub, ALICE)[0]["milli"] == 250

    r = hub.gpulab("POST", "/hibernations", token=alice, json={"server": ""})
    assert r.status_code == 202, r.text
    row = hibernated(hub, alice, r.json()["id"])
    assert row["state"] == "hibernated", row
    assert row["kernels"] == 1 and row["bytes"] > 0 and row["gpu_milli"] == 250
    assert row["summary"].startswith("hibernated at ") and "1 kernel" in row["summary"]
    (kernel,) = row["kernel_states"]
    assert kernel["name"] == "analysis.ipynb"
    assert {s["name"] for s in kernel["skipped"]} == {"gen", "notes"}

    # The slice went back: no server, no allocation; usage stops counting it.
    hub.wait_server(ALICE, ready=False)
    assert server_slices(hub, ALICE) == []

    def server_gpu_seconds():
        params = {"group_by": "kind"}
        rows = hub.gpulab("GET", "/usage", token=alice, params=params).json()["rows"]
        return sum(r["milli_gpu_seconds"] for r in rows if r["kind"] == "server")

    counted = server_gpu_seconds()
    assert counted > 0  # the quarter GPU was counted while it was held
    since = time.monotonic()
    until("2 s to pass", lambda: time.monotonic() - since > 2, timeout=10)
    assert server_gpu_seconds() == counted

    # The state is alice's alone: her files, 0600 in a 0700 folder, which bob's
    # account cannot read; the service answers bob as if it did not exist.
    state = hub.home(ALICE) / ".gpulab" / "hibernate" / row["id"] / "0.state"
    assert state.exists()
    assert state.stat().st_mode & 0o777 == 0o600
    assert state.parent.stat().st_mode & 0o777 == 0o700
    if hub.accounts:
        assert state.stat().st_uid == pwd.getpwnam(f"gpulab-{ALICE}").pw_uid
        peek = subprocess.run(
            ["runuser", "-u", f"gpulab-{BOB}", "--", "cat", str(state)],
            capture_output=True,
            text=True,
        )
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
    assert hub.gpulab("GET", f"/hibernations/{row['id']}", token=bob).status_code == 404
    assert hub.gpulab("GET", "/hibernations", token=bob, params={"user": ALICE}).status_code == 403
    denied = hub.gpulab("POST", "/hibernations", token=bob, json={"user": ALICE})
    assert denied.status_code == 403, denied.text
    wake = {"name": "analysis.ipynb", "restored": [], "failed": []}
    forged = hub.gpulab("POST", f"/hibernations/{row['id']}/wakes", token=bob, json=wake)
    assert forged.status_code == 404

    # Wake on half a GPU: opening the notebook restores it; the first cell says how.
    hub.spawn_ready({ALICE: {"gpu_milli": 500}})
    assert server_slices(hub, ALICE)[0]["milli"] == 500
    nb = NotebookKernel(server, alice, "analysis.ipynb")
    said = nb.run("print('first cell')")
    line = said.splitlines()[0]
    assert line.startswith("Woken from hibernation"), said
    assert "analysis.ipynb" in line and "not back: " in line
    assert "gen (a generator" in line and "notes (an open file" in line
    assert digest_of(nb.run(FINGERPRINT)) == before
    checks = nb.run(
        "print(square(7), type(fig).__name__, len(df), arr.shape,"
        " opt.param_groups[0]['params'][0] is next(model.parameters()))"
    )
    assert checks.split() == ["49", "Figure", "300", "(500,", "200)", "True"]
    assert "gen" not in nb.run("print(sorted(k for k in globals() if not k.startswith('_')))")

    done = until(
        "the kernel to report its wake",
        lambda: (
            (r := hub.gpulab("GET", f"/hibernations/{row['id']}", token=alice).json())["state"]
            == "woken"
            and r
        ),
        timeout=60,
    )
    assert "model" in done["wakes"][0]["restored"]

    def actions():
        entries = hub.gpulab("GET", "/audit", token=alice, params={"subject": f"{ALICE}/"})
        return {e["action"] for e in entries.json()["entries"]}

    # The wake's audit entry is written just after its row says "woken".
    until("the wake in the audit trail", lambda: {"server.hibernate", "server.wake"} <= actions())


def test_scheduler_hibernates_an_idle_server_before_a_batch_job(hub):
    alice, bob, carol = (hub.create_user(u) for u in (ALICE, BOB, CAROL))
    for user in (ALICE, BOB):
        hub.hub_api("DELETE", f"/users/{user}/server")
        hub.wait_server(user, ready=False)
    hub.spawn_ready({ALICE: {"gpu_milli": 1000}})
    nb = NotebookKernel(f"{hub.url}/user/{ALICE}", alice, "idle.ipynb")
    nb.run("marker = {'kept': 42}")
    job = hub.gpulab(
        "POST",
        "/jobs",
        token=bob,
        json={"code": "import time\ntime.sleep(900)", "name": "long", "gpu_milli": 1000},
    ).json()
    assert "id" in job, job
    until(
        "bob's job running",
        lambda: hub.gpulab("GET", f"/jobs/{job['id']}", token=bob).json()["state"] == "running",
    )

    # alice's notebook has been idle for longer than the scheduler asks (2 s here).
    def alice_idle_for():
        kernels = requests.get(
            f"{hub.url}/user/{ALICE}/api/kernels", headers=hub.auth(alice), timeout=30
        ).json()
        last = max(dt.datetime.fromisoformat(k["last_activity"]) for k in kernels)
        return (dt.datetime.now(dt.UTC) - last).total_seconds() > 3

    until("alice's notebook to idle", alice_idle_for, timeout=30)

    # Both GPUs are held. carol's server takes alice's (idle) one, not bob's job's.
    hub.spawn_ready({CAROL: {"gpu_milli": 1000}})
    assert server_slices(hub, CAROL)[0]["milli"] == 1000
    assert hub.gpulab("GET", f"/jobs/{job['id']}", token=bob).json()["state"] == "running"
    (latest, *_) = hub.gpulab("GET", "/hibernations", token=alice).json()
    assert latest["state"] == "hibernated", latest
    assert CAROL in latest["reason"] and latest["actor"] == "gpulab"
    hub.wait_server(ALICE, ready=False)

    # carol leaves; alice comes back with her state.
    hub.hub_api("DELETE", f"/users/{CAROL}/server")
    hub.wait_server(CAROL, ready=False)
    hub.spawn_ready({ALICE: {"gpu_milli": 250}})
    nb = NotebookKernel(f"{hub.url}/user/{ALICE}", alice, "idle.ipynb")
    out = nb.run("print(marker)")
    assert out.splitlines()[0].startswith("Woken from hibernation"), out
    assert out.splitlines()[-1] == "{'kept': 42}"
    hub.gpulab("DELETE", f"/jobs/{job['id']}", token=bob)


def test_a_hibernation_over_the_cap_fails_and_the_server_runs_on(hub):
    """From the notebook itself (``%gpulab hibernate``): its state is over the site's
    cap, so nothing is stopped and the row says why; the variables are all there."""
    dave = hub.create_user(DAVE)
    hub.spawn_ready({DAVE: {"gpu_milli": 250}})
    nb = NotebookKernel(f"{hub.url}/user/{DAVE}", dave, "big.ipynb")
    nb.run("import numpy as np\nbig = np.ones(10_000_000)  # 80 MB, over the 50 MB cap")
    said = nb.run("%gpulab hibernate")
    assert said.startswith("Hibernating this server (h-"), said
    hid = said.split("(", 1)[1].split(")", 1)[0]
    row = hibernated(hub, dave, hid)
    assert row["state"] == "failed", row
    assert row["error"].startswith(
        "nothing was stopped: a kernel's state is over the cap of 50 MB: delete large"
    ), row["error"]
    assert hub.wait_server(DAVE)  # still running
    assert nb.run("print(big.sum())").strip() == "10000000.0"
    assert not (hub.home(DAVE) / ".gpulab" / "hibernate" / hid).exists()
    assert "hibernation failed" in nb.run("%gpulab")
