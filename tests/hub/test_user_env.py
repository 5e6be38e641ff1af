"""A data scientist's environment: pandas, scikit-learn and matplotlib in a fresh
kernel, and ``%pip install`` that lands in the user's own environment, seen by
their kernels, their job's ranks and their replicas, kept across a server restart,
and invisible to another user (the shared real hub, each user a Unix account of
their own).

The package installed is a wheel built here (``--no-index``): the test needs no
package index, and what it installs is the user's own code.
"""

import base64
import hashlib
import os
import re
import tempfile
import zipfile
from pathlib import Path

import psutil
import pytest
import torch
from hubproc import fresh_user
from kernelexec import run_in_kernel
from support.wait import wait_until

from gpulab.client import Client
from gpulab.enforcement.accounts import unix_name
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow

OWNER, OTHER = fresh_user("piper"), fresh_user("pipother")
PACKAGE = "gpulab_tiny"


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, ``gpulab_tiny``, that says where it lives."""
    files = {
        f"{PACKAGE}/__init__.py": "import os\nWHERE = os.path.dirname(__file__)\n",
        f"{PACKAGE}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\n"
        "Version: 1.0\n",
        f"{PACKAGE}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files[f"{PACKAGE}-1.0.dist-info/RECORD"] = (
        "\n".join(record + [f"{PACKAGE}-1.0.dist-info/RECORD,,"]) + "\n"
    )
    path = folder / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    path.chmod(0o644)
    return path


def restart(hub, user):
    hub.hub_api("DELETE", f"/users/{user}/server")
    hub.wait_server(user, ready=False)
    assert hub.spawn(user, {"gpu_milli": 0}).status_code in (201, 202)
    hub.wait_server(user)


def test_pip_install_in_a_notebook_is_the_users_own_everywhere_they_run_code(hub, tmp_path):
    token = hub.create_user(OWNER)
    hub.spawn_ready({OWNER: {"gpu_milli": 0}})
    server = f"{hub.url}/user/{OWNER}"
    env_python = str(hub.home(OWNER) / ".gpulab" / "env" / "bin" / "python")

    # A fresh kernel: the data-science stack beside torch, in the user's own environment.
    out = run_in_kernel(
        server,
        token,
        "import sys, pandas, sklearn, matplotlib, torch\n"
        "print('python', sys.executable)\n"
        "print(pandas.DataFrame({'a': [1, 2]}).a.sum())",
    )
    assert f"python {env_python}" in out and "\n3" in out, out

    # %pip install, as a user types it: into their environment, importable at once.
    folder = Path(tempfile.mkdtemp(prefix="wheel-", dir="/tmp"))
    folder.chmod(0o755)  # the user's account reads the wheel
    wheel = tiny_wheel(folder)
    out = run_in_kernel(
        server,
        token,
        f"%pip install --no-index --no-deps {wheel}\n"
        f"import {PACKAGE}\nprint('at', {PACKAGE}.WHERE)",
        timeout=180,
    )
    assert "Successfully installed gpulab-tiny-1.0" in out, out
    site = re.search(r"^at (.+)$", out, re.M).group(1)
    assert site.startswith(str(hub.home(OWNER) / ".gpulab" / "env")), out

    # Both ranks of a 2-rank job import it (the ranks run the same environment).
    out = run_in_kernel(
        server,
        token,
        "%%train_distributed --nproc-per-node 2 --detach --name pipcheck\n"
        f"import os, {PACKAGE}\n"
        f"print('rank', os.environ['RANK'], 'imports', {PACKAGE}.WHERE)",
    )
    job_id = re.search(r"job (\w+) submitted", out).group(1)
    wait_until(
        lambda: (
            hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()["state"]
            in ("succeeded", "failed")
        ),
        "the 2-rank job",
    )
    logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
    assert hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()["state"] == "succeeded", logs
    assert f"rank 0 imports {site}" in logs and f"rank 1 imports {site}" in logs, logs

    # The user's replicas run their environment's interpreter too.
    model = tmp_path / "model"
    export_model(
        torch.nn.Linear(4, 2).eval(), torch.randn(2, 4), str(model), name="m", max_batch_size=4
    )
    Client(hub.api, token=token).create_deployment(str(model), {"name": "pipmodel", "gpu_milli": 0})
    uid = hub.home(OWNER).stat().st_uid
    replica = wait_until(
        lambda: [
            p
            for p in psutil.process_iter(["uids", "cmdline"])
            if p.info["uids"]
            and p.info["uids"].real == uid
            and "gpulab.serving.server" in (p.info["cmdline"] or [])
        ],
        "the replica's process",
    )[0]
    assert replica.info["cmdline"][0] == env_python, replica.info["cmdline"]
    hub.gpulab("DELETE", "/deployments/pipmodel", token=token)

    # Kept across a server restart: it lives in their home.
    restart(hub, OWNER)
    out = run_in_kernel(server, token, f"import {PACKAGE}\nprint('at', {PACKAGE}.WHERE)")
    assert f"at {site}" in out, out

    # Another user neither imports it nor reads the owner's environment.
    other_token = hub.create_user(OTHER)
    hub.spawn_ready({OTHER: {"gpu_milli": 0}})
    out = run_in_kernel(
        f"{hub.url}/user/{OTHER}",
        other_token,
        "import importlib.util, os\n"
        f"print('finds', importlib.util.find_spec({PACKAGE!r}) is not None)\n"
        f"try:\n    os.listdir({site!r})\nexcept PermissionError:\n    print('refused')",
    )
    assert "finds False" in out and "refused" in out, out
    assert unix_name(OTHER) != unix_name(OWNER)
    os.remove(wheel)
