"""What ``%deploy`` says when its replicas never start, and what its table says after
``%deploy --stop``: on the real service in this process (a stand-in hub API), with the
real client and the real magics in an IPython shell. The replicas that fail are real
model-server processes given a model file that is not one.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from support.service import running_service
from test_model_storage_quota import zeros_archive

from gpulab.client import Client
from gpulab.client.deployments import pack_model_dir
from gpulab.magics.deploy import DeployMagics
from gpulab.magics.deploy_failure import DeploymentFailed
from gpulab.magics.deploy_live import DeploymentsTable, LiveTable
from gpulab.serving.export import export_model


@pytest.fixture
async def svc(tmp_path):
    async with running_service(tmp_path / "svc") as service:
        yield service


@pytest.fixture
def small_model_tar(tmp_path) -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    export_model(model.eval(), torch.randn(2, 4), str(tmp_path / "m"), name="m", max_batch_size=4)
    return pack_model_dir(str(tmp_path / "m"))


async def deploy(svc, token, spec: dict, archive: bytes) -> dict:
    r = await svc.request(
        "POST",
        "/deployments",
        token=token,
        files={"spec": (None, json.dumps(spec)), "model": ("model.tar.gz", archive)},
    )
    assert r.status_code == 201, r.text
    return r.json()


async def test_replicas_that_never_start_raise_with_the_replicas_reason(svc, capsys):
    alice = svc.create_user("alice")
    dep = await deploy(svc, alice, {"name": "broken", "replicas": 1}, zeros_archive(1000))
    client = Client(svc.api, alice)
    with pytest.raises(DeploymentFailed) as failed:
        await asyncio.to_thread(DeployMagics._wait, client, dep)
    message = str(failed.value)
    # What happened (the service's words), why (the replica's own last log line), and
    # what to do, on one line without the log's noise before it.
    assert "broken: the replicas did not start: replica 0 exited with code 1" in message
    assert "replica log: gpulab-serving: " in message  # the model server's own reason
    assert "%deploy --logs broken" in message and "--replace" in message
    assert "\n" not in message
    shown = "\n".join(failed.value._render_traceback_())
    assert "DeploymentFailed" in shown and "replica log (last lines):" in shown
    assert "broken: failed, 0/1 replica ready" in capsys.readouterr().out


async def test_after_deploy_stop_the_table_says_stopped(svc, small_model_tar, monkeypatch):
    bob = svc.create_user("bob")
    await deploy(svc, bob, {"name": "kept", "min_replicas": 0, "max_replicas": 1}, small_model_tar)
    await deploy(svc, bob, {"name": "gone", "min_replicas": 0, "max_replicas": 1}, small_model_tar)
    monkeypatch.setenv("GPULAB_API_URL", svc.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", bob)
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("gpulab.magics")

    def notebook():
        with capture_output() as out:
            table = DeploymentsTable(Client().list_deployments, every=3600)
            table.show()  # cell 1: %deploy --list
            shell.run_cell("%deploy --stop gone")  # cell 2
        return table, out

    table, out = await asyncio.to_thread(notebook)
    try:
        assert LiveTable.current is table
        last = out.outputs[-1].data["text/plain"]  # the table's output, as it stays
        rows = {line.split()[0]: line for line in last.splitlines()[2:4]}
        assert rows["gone"].split()[2:4] == ["stopped", "0/1"], last
        assert "stopped" not in rows["kept"], last
        assert "gone stopped at" in last and "no longer refreshing" in last
        assert "stopped gone: " in out.stdout
    finally:
        table.stop()
