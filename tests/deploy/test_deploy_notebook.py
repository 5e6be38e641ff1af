"""The example notebook, and ``%deploy`` as a user types it: nbclient runs
``notebooks/deploy.ipynb`` in a real kernel against a real hub; the curl line
the magic prints is then run as printed.

The kernel's environment carries what a gpulab server's has: ``GPULAB_API_URL``
and a user's ``JUPYTERHUB_API_TOKEN``.
"""

import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "deploy.ipynb"


def text_of(cell) -> str:
    """Printed text and plain-text displays (``%deploy --list`` is one, kept current)."""
    return "".join(
        o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
        for o in cell.outputs
        if o.output_type in ("stream", "display_data")
    )


def test_notebook_trains_quantizes_deploys_and_calls(hub, tmp_path, monkeypatch):
    token = hub.create_user("nbdeploy")
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Before the last cell (--stop): what a user would check while it runs.
    nb.cells.insert(
        len(nb.cells) - 1,
        nbformat.v4.new_code_cell(
            "import json\nfrom gpulab.client import Client\n"
            "print('ALLOC', json.dumps(Client().allocations()))"
        ),
    )
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    cells = {c.source.split("\n")[0]: text_of(c) for c in nb.cells if c.cell_type == "code"}

    quant = cells["%quantize model --scheme int8-dynamic --example batch --to qmodel"]
    assert "size" in quant and "torch-ao" in quant

    deploy = next(v for k, v in cells.items() if k.startswith("%deploy qmodel"))
    url = f"{hub.url}/services/gpulab/endpoints/nbdeploy/sentiment"
    assert f"endpoint: {url}" in deploy and "sentiment: running, 2/2 replicas ready" in deploy
    assert "tritonclient" in deploy and "curl -H" in deploy

    call = next(v for k, v in cells.items() if k == "import os")
    diff = float(re.search(r"max \|served - notebook\| = (\S+)", call).group(1))
    assert diff < 1e-4 and "same predictions: True" in call

    # The canary: started beside, 20% of the calls, listed per version, promoted.
    canary = cells["%deploy model --name sentiment --example x --canary 20 --gpu 0.25"]
    assert "sentiment: version 2 gets 20% of calls" in canary, canary
    both = [c for c in nb.cells if c.source == "%deploy --list"][0]
    assert "v1 · 80% of calls · running" in text_of(both), text_of(both)
    assert "v2 · 20% of calls · running" in text_of(both), text_of(both)
    # The lab draws it as a table; the next cell froze it (promoted, it would differ).
    (shown,) = [o for o in both.outputs if o.output_type == "display_data"]
    assert 'class="gpulab-deploy-list"' in shown["data"]["text/html"]
    assert "no longer refreshing" in shown["data"]["text/plain"]
    assert "version 2 takes every call" in cells["%deploy --promote sentiment"]

    # The last one, after the promotion: the notebook's last cell stops the endpoint,
    # and the table it left says so (not "running 2/2").
    listing = cells["%deploy --list"]
    assert re.search(r"sentiment\s+nbdeploy\s+stopped\s+0/2\s+2:3\s+1/4 GPU", listing), listing
    assert "sentiment stopped at" in listing, listing

    allocs = __import__("json").loads(
        next(v for k, v in cells.items() if k == "import json").split("ALLOC ", 1)[1]
    )
    assert sorted((a["owner_kind"], a["milli"]) for a in allocs) == [("deployment", 250)] * 2
    assert (
        "stopped sentiment: 2 replicas stopped, their slices released"
        in cells["%deploy --stop sentiment"]
    )
    assert hub.gpulab("GET", "/allocations", token=token).json() == []
    assert hub.gpulab("GET", "/deployments", token=token).json() == []


def test_the_printed_curl_line_works(hub, monkeypatch, tmp_path):
    """``%deploy`` in an IPython shell; the curl line it prints is run by bash as printed."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    token = hub.create_user("curler")
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    ip.run_cell(
        "import torch\ntorch.manual_seed(1)\nm = torch.nn.Linear(3, 2).eval()\nx = torch.ones(2, 3)"
    )
    with capture_output() as out:
        ip.run_line_magic("deploy", "m --name lin --example x --max-batch-size 4")
    printed = out.stdout
    curl = printed.split("curl (JSON", 1)[1].split("\n\n")[0].split("\n", 1)[1]
    run = subprocess.run(
        ["bash", "-c", curl],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "JUPYTERHUB_API_TOKEN": token},
    )
    assert run.returncode == 0, run.stderr
    import json

    import torch

    answer = json.loads(run.stdout)
    expected = ip.user_ns["m"](torch.ones(1, 3)).detach().numpy().reshape(-1)
    assert answer["outputs"][0]["data"] == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-6)

    with capture_output() as out:
        ip.run_line_magic("deploy", "--list")
    assert re.search(r"lin\s+curler\s+running\s+1/1\s+1:1", out.stdout), out.stdout
    # Usage errors say what to do; the service's refusals come back as messages.
    with pytest.raises(Exception, match="usage: %deploy MODEL"):
        ip.run_line_magic("deploy", "m --name nope")
    with pytest.raises(Exception, match="already have a deployment 'lin'"):
        ip.run_line_magic("deploy", "m --name lin --example x --max-batch-size 4")
    with capture_output() as out:
        ip.run_line_magic("deploy", "--stop lin")
    assert "stopped lin" in out.stdout
    with pytest.raises(Exception, match="No deployment named 'lin'. You have none"):
        ip.run_line_magic("deploy", "--stop lin")
