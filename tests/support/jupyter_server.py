"""A real jupyter_server from the venv (whose config enables gpulab.lab), on a free
port, with its own HOME and config folder: for tests of the server extension."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import requests
from hubproc import free_port

from support.wait import wait_until

SERVER_TOKEN = "lab-test-server-token"
JUPYTER_SERVER = str(Path(sys.executable).with_name("jupyter-server"))


@contextmanager
def jupyter_server(tmp: Path, env_extra: dict[str, str], *args: str):
    """A real jupyter_server from the venv (whose config enables gpulab.lab)."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "GPULAB_"))}
    env.update(HOME=str(tmp), JUPYTER_CONFIG_DIR=str(tmp / "config"), **env_extra)
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [
            JUPYTER_SERVER,
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={SERVER_TOKEN}",
            "--allow-root",
            f"--ServerApp.root_dir={tmp}",
            *args,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError((tmp / "server.log").read_text()[-3000:])
        try:
            return requests.get(f"{url}/api/status", params={"token": SERVER_TOKEN}, timeout=5).ok
        except requests.ConnectionError:
            return False

    try:
        wait_until(up, "jupyter_server to answer", 120)
        log_text = (tmp / "server.log").read_text()
        assert "gpulab: JupyterLab routes under /gpulab" in log_text, (
            "gpulab.lab is not enabled in the venv: run `make lab`\n" + log_text[-3000:]
        )
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
