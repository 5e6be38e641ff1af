"""A server's side of hibernation in a real jupyter_server with real kernels (the
kernelspec gpulab's servers use: ipykernel with gpulab's magics), no hub: what the
service's calls find there (``POST gpulab/hibernate``, ``GET gpulab/activity``).

- Two hibernate/wake cycles keep every variable: restored names are the user's
  (``%who`` lists them; the second hibernation saves them), and the wake line
  counts against what the notebook held the first time.
- A kernel shut down while it saves is noticed at once: the others are saved, and
  the answer names the one that went away.
- A thread, a subprocess or a command in a terminal makes the server not idle.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import threading

import pytest
import requests
from support.jupyter_server import SERVER_TOKEN, jupyter_server
from support.notebook_kernel import CellError, NotebookKernel
from support.wait import wait_until

from gpulab.enforcement.user_env import kernelspec

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"token {SERVER_TOKEN}"}
CAP = 10**9
WAIT_S = 120  # a bound on a loaded 2-core machine, not a sleep


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("hibernate-server")
    spec = home / "share" / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(kernelspec(sys.executable)))
    env = {"JUPYTER_PATH": str(home / "share" / "jupyter")}
    with jupyter_server(home, env) as url:
        yield url, home


def hibernate(url: str) -> tuple[str, requests.Response]:
    hid = f"h-{secrets.token_hex(6)}"
    body = {"id": hid, "max_bytes": CAP}
    return hid, requests.post(f"{url}/gpulab/hibernate", json=body, headers=AUTH, timeout=300)


def close(url: str, nb: NotebookKernel) -> None:
    """Close the notebook (its session and kernel), as a closed tab does."""
    r = requests.delete(f"{url}/api/sessions/{nb.session['id']}", headers=AUTH, timeout=60)
    assert r.status_code == 204, r.text


def test_two_cycles_keep_every_variable(server):
    url, _ = server
    nb = NotebookKernel(url, SERVER_TOKEN, "cycles.ipynb")
    nb.run("import numpy as np\na = 1\narr = np.arange(5)\ngen = (i for i in range(3))")
    for cycle, (new, value) in enumerate((("b", "'made after wake 1'"), ("c", "[3, 4]"))):
        _, r = hibernate(url)
        assert r.status_code == 200, r.text
        close(url, nb)
        nb = NotebookKernel(url, SERVER_TOKEN, "cycles.ipynb")
        said = nb.run("%who")
        line, who = said.splitlines()[0], said.splitlines()[-1].split()
        # np, a, arr of the first four (the generator never saved), and what came since.
        assert f"{3 + cycle} of {4 + cycle} variables back" in line, said
        assert "not back: gen (a generator" in line
        assert {"np", "a", "arr", *"bc"[:cycle]} == set(who), said
        nb.run(f"{new} = {value}")
    _, r = hibernate(url)
    assert r.status_code == 200, r.text
    close(url, nb)
    nb = NotebookKernel(url, SERVER_TOKEN, "cycles.ipynb")
    said = nb.run("print(a, arr.tolist(), b, c)")
    assert "5 of 6 variables back" in said.splitlines()[0], said
    assert said.splitlines()[-1] == "1 [0, 1, 2, 3, 4] made after wake 1 [3, 4]"
    close(url, nb)


def test_a_kernel_shut_down_while_saving_is_left_out_at_once(server):
    url, home = server
    kept = NotebookKernel(url, SERVER_TOKEN, "kept.ipynb")
    kept.run("x = 41")
    busy = NotebookKernel(url, SERVER_TOKEN, "busy.ipynb")

    # A cell that runs on: the kernel cannot start saving until it ends.
    def long_cell():
        with contextlib.suppress(ConnectionError, CellError):  # its kernel is shut down
            busy.run("import time\ntime.sleep(900)")

    running = threading.Thread(target=long_cell, daemon=True)
    running.start()
    wait_until(
        lambda: (
            requests.get(f"{url}/api/kernels/{busy.kernel_id}", headers=AUTH, timeout=30).json()[
                "execution_state"
            ]
            == "busy"
        ),
        "the long cell to run",
        WAIT_S,
    )
    answer: dict = {}
    hid = f"h-{secrets.token_hex(6)}"

    def post():
        body = {"id": hid, "max_bytes": CAP}
        r = requests.post(f"{url}/gpulab/hibernate", json=body, headers=AUTH, timeout=300)
        answer["r"] = r

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    folder = home / ".gpulab" / "hibernate" / hid
    # The kept kernel has saved: the busy one is being waited for now.
    wait_until(
        lambda: folder.exists() and any(p.suffix == ".state" for p in folder.iterdir()),
        "the idle kernel to save",
        WAIT_S,
    )
    close(url, busy)  # the tab closes while its kernel is being saved
    poster.join(WAIT_S)
    assert "r" in answer, "the hibernation still waits on the kernel that was shut down"
    r = answer["r"]
    assert r.status_code == 200, r.text
    result = r.json()
    assert [k["name"] for k in result["kernels"]] == ["kept.ipynb"], result
    assert result["gone"] == [
        {
            "name": "busy.ipynb",
            "notebook": result["gone"][0]["notebook"],
            "why": "its kernel was shut down while saving",
        }
    ]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["manifest.json", result["kernels"][0]["file"]]
    )
    close(url, kept)


def activity(url: str) -> list[str]:
    r = requests.get(f"{url}/gpulab/activity", headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["work"]


def test_threads_subprocesses_and_terminals_are_work(server):
    url, _ = server
    nb = NotebookKernel(url, SERVER_TOKEN, "work.ipynb")
    nb.run("import threading, time, subprocess")
    assert activity(url) == []

    # A thread the user started (sleeping: no CPU), daemon or not.
    nb.run(
        "stop = threading.Event()\n"
        "def fetch():\n"
        "    stop.wait()\n"
        "worker = threading.Thread(target=fetch, name='download', daemon=True)\n"
        "worker.start()"
    )
    # The kernel's watcher looks every few seconds: a bound, not a sleep.
    work = wait_until(lambda: activity(url), "the thread to show", WAIT_S)
    assert len(work) == 1 and "thread download (fetch)" in work[0], work
    nb.run("stop.set(); worker.join()")
    wait_until(lambda: activity(url) == [], "the thread's end to show", WAIT_S)

    # A subprocess of the kernel.
    nb.run("proc = subprocess.Popen(['sleep', '600'])")
    work = activity(url)
    assert len(work) == 1 and "(sleep)" in work[0], work
    nb.run("proc.kill(); proc.wait()")
    assert activity(url) == []

    # A command running in a terminal (its shell alone is not work).
    term = requests.post(f"{url}/api/terminals", headers=AUTH, timeout=30).json()["name"]
    assert activity(url) == []
    ws_run(url, term, "sleep 600\r")
    work = wait_until(lambda: activity(url), "the terminal's command to show", WAIT_S)
    assert len(work) == 1 and f"terminal {term}: " in work[0] and "(sleep)" in work[0], work
    requests.delete(f"{url}/api/terminals/{term}", headers=AUTH, timeout=30)
    close(url, nb)


def ws_run(url: str, term: str, text: str) -> None:
    """Type ``text`` into a terminal (terminado's websocket protocol)."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def send():
        ws_url = url.replace("http", "ws", 1) + f"/terminals/websocket/{term}"
        ws = await websocket_connect(HTTPRequest(ws_url, headers=AUTH))
        await ws.write_message(json.dumps(["stdin", text]))
        await ws.read_message()
        ws.close()

    asyncio.run(send())
