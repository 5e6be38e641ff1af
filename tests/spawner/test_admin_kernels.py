"""Environments an admin adds are offered as kernels in every server: a real
kernelspec folder, read by jupyter_client as a server reads it, and a real kernel
started from it."""

import json
import os
import shutil
import sys
import tempfile
import venv
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from traitlets.config import Config

from gpulab.spawner.local import FractionalLocalSpawner


def spawner(tmp_path, kernels):
    c = Config()
    c.FractionalHostSpawner.kernel_dir = str(tmp_path / "jupyter")
    c.FractionalHostSpawner.kernels = kernels
    return FractionalLocalSpawner(config=c)


def test_an_admins_environments_are_kernels_beside_gpulabs(tmp_path, caplog, request):
    # A plain environment of the admin's (no gpulab in it), and gpulab's own; where
    # every account reaches it (pytest's folders are 0700).
    plain = Path(tempfile.mkdtemp(prefix="admin-env-", dir="/tmp"))
    plain.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(plain))
    venv.EnvBuilder(system_site_packages=False, symlinks=True).create(plain)
    s = spawner(
        tmp_path,
        {
            "Python 3 (gpulab, again)": sys.executable,
            "Plain Python": str(plain / "bin" / "python"),
            "Gone": "/nonexistent/env/bin/python",
        },
    )
    s._write_kernelspec()
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter" / "kernels")])
    found = {k: v["spec"] for k, v in specs.get_all_specs().items()}
    assert set(found) >= {"python3", "gpulab-python-3-gpulab-again", "gpulab-plain-python"}
    assert "gpulab-gone" not in found
    assert "The kernel 'Gone' is not offered: /nonexistent" in caplog.text
    # gpulab's magics load only where gpulab is installed.
    assert "--ext=gpulab.magics" in found["gpulab-python-3-gpulab-again"]["argv"]
    assert "--ext=gpulab.magics" not in found["gpulab-plain-python"]["argv"]
    assert found["gpulab-plain-python"]["display_name"] == "Plain Python"

    # A kernel starts from it, in that environment.
    km = KernelManager(kernel_name="gpulab-python-3-gpulab-again", kernel_spec_manager=specs)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    out = []
    try:
        reply = kc.execute_interactive(
            "import sys; print(sys.executable)\n"
            "print(get_ipython().find_line_magic('gpulab') is not None)",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok"
        assert "".join(out).split() == [sys.executable, "True"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    # An environment the admin takes out is no longer offered.
    s = spawner(tmp_path, {})
    s._write_kernelspec()
    assert sorted(os.listdir(tmp_path / "jupyter" / "kernels")) == ["python3"]
    spec = json.loads((tmp_path / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
