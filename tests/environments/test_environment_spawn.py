"""Environments on the spawn form, for real: an admin's venv (made here, with
--system-site-packages), picked at spawn; the server's kernel runs in it
(``sys.prefix`` is the venv's) with gpulab's magics, ``%pip install`` lands in the
user's own layer over it, and a job from that server runs its ranks in it. A hub of
this module's own (its config declares the environment)."""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hubproc import RunningHub, fresh_user
from kernelexec import run_in_kernel
from support.wait import wait_until

pytestmark = pytest.mark.slow

USER, OTHER = fresh_user("envy"), fresh_user("envother")


@pytest.fixture(scope="module")
def science_env():
    """An admin's environment where every account reaches it (pytest's folders are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="site-env-", dir="/tmp"))
    root.chmod(0o755)
    prefix = root / "science"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip", str(prefix)],
        check=True,
    )
    yield prefix
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, science_env):
    config = (
        "c.SiteEnvironments.environments = {\n"
        f'    "science": {{"prefix": {str(science_env)!r}, "description": "the lab\'s venv"}},\n'
        '    "cluster-only": {"image": "ghcr.io/site/cu12:1"},\n'
        "}\n"
    )
    h = RunningHub(tmp_path_factory.mktemp("env-hub"), simulate="1xA100-80GB", config=config)
    yield h
    h.stop()


def test_the_picked_environment_runs_the_kernel_and_the_users_installs(hub, science_env):
    token = hub.create_user(USER)
    # Not one this site runs on the box, or none at all: a 400 naming those it has.
    for name in ("cluster-only", "nope"):
        r = hub.spawn(USER, {"gpu_milli": 0, "environment": name})
        assert r.status_code == 400, r.text
        assert f"unknown environment {name!r}; this site's: science" in r.json()["message"]

    assert hub.spawn(USER, {"gpu_milli": 0, "environment": "science"}).status_code in (201, 202)
    hub.wait_server(USER)
    server = f"{hub.url}/user/{USER}"
    out = run_in_kernel(
        server,
        token,
        "import os, sys\n"
        "print('prefix', sys.prefix)\n"
        "print('env', os.environ['GPULAB_ENVIRONMENT'])\n"
        "print('magics', get_ipython().find_line_magic('gpulab') is not None)",
    )
    assert f"prefix {science_env}" in out, out
    assert "env science" in out and "magics True" in out, out

    # %pip install, as a user types it: into their layer over the environment.
    folder = Path(tempfile.mkdtemp(prefix="wheel-", dir="/tmp"))
    folder.chmod(0o755)
    wheel = tiny_wheel(folder)
    out = run_in_kernel(
        server,
        token,
        f"%pip install --no-index --no-deps {wheel}\nimport envtiny\nprint('at', envtiny.WHERE)",
        timeout=180,
    )
    assert "Successfully installed envtiny-1.0" in out, out
    site = re.search(r"^at (.+)$", out, re.M).group(1)
    assert site.startswith(str(hub.home(USER) / ".gpulab" / "envs" / "science")), out
    # The environment itself is untouched: nobody else gets it.
    assert not list(science_env.glob("lib/python3*/site-packages/envtiny"))

    # A job from this server runs its ranks in the environment, with the user's installs.
    out = run_in_kernel(
        server,
        token,
        "%%train_distributed --detach --name envcheck\n"
        "import sys, envtiny\nprint('rank prefix', sys.prefix, 'tiny', envtiny.WHERE)",
    )
    job_id = re.search(r"job (\w+) submitted", out).group(1)
    wait_until(
        lambda: (
            hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()["state"]
            in ("succeeded", "failed")
        ),
        "the job",
    )
    logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
    job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
    assert job["state"] == "succeeded", logs
    assert "[gpulab] ranks run in the environment science" in logs, logs
    assert f"rank prefix {science_env} tiny {site}" in logs, logs

    # A job naming an environment the site does not have is refused at once.
    r = hub.gpulab("POST", "/jobs", token=token, json={"code": "print(1)", "environment": "nope"})
    assert r.status_code == 400 and "unknown environment 'nope'" in r.json()["error"], r.text
    hub.hub_api("DELETE", f"/users/{USER}/server")


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, ``envtiny``, that says where it lives."""
    import base64
    import hashlib
    import zipfile

    files = {
        "envtiny/__init__.py": "import os\nWHERE = os.path.dirname(__file__)\n",
        "envtiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: envtiny\nVersion: 1.0\n",
        "envtiny-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files["envtiny-1.0.dist-info/RECORD"] = (
        "\n".join(record + ["envtiny-1.0.dist-info/RECORD,,"]) + "\n"
    )
    path = folder / "envtiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    path.chmod(0o644)
    return path
