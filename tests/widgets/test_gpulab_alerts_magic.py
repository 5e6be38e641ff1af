"""``%gpulab``'s alert line and ``%gpulab alerts [--all]``, against the real service.

The service runs in this process (``support.service.running_service``, a stand-in
hub API); alert rows are written into its database, and the magics run in a real
IPython shell whose environment is what a gpulab server gives alice's kernel. The
magics call the service through the real client, from a worker thread (the service
serves on the test's event loop). No hub is started.
"""

import asyncio
import socket

import pytest
from IPython.core.interactiveshell import InteractiveShell
from test_dashboard_alerts import ALERTS, GPU, seed, serve


@pytest.fixture
def shell(monkeypatch):
    monkeypatch.setenv("GPULAB_GPU_MILLI", "250")
    monkeypatch.setenv("GPULAB_GPU_UUID", GPU)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    return ip


async def gpulab(shell, capsys, line=""):
    capsys.readouterr()
    await asyncio.to_thread(shell.run_line_magic, "gpulab", line)
    return capsys.readouterr().out


def as_user(monkeypatch, svc, token):
    monkeypatch.setenv("GPULAB_API_URL", svc.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)


async def test_status_shows_one_alert_line_with_the_badge(tmp_path, shell, capsys, monkeypatch):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        seed(svc, ALERTS)
        as_user(monkeypatch, svc, alice)
        out = await gpulab(shell, capsys)
        assert "GPU: 1/4 GPU on " in out and f"API: {svc.api}" in out, out
        lines = [x for x in out.splitlines() if x.startswith("Alerts:")]
        assert lines == [
            "Alerts: [critical] 1 alert firing: JobStalled (job 3f2a1b9c0d1e)  "
            "(%gpulab alerts lists them)"
        ], out

        # An admin's line names every firing alert, a GPU by its shortened uuid.
        as_user(monkeypatch, svc, svc.admin_token)
        out = await gpulab(shell, capsys)
        assert (
            "Alerts: [critical] 3 alerts firing: JobStalled (job 3f2a1b9c0d1e), "
            "QuotaNearlyUsed (user bob), GpuXidErrors (GPU-8f1e2a3b…)"
        ) in out, out


async def test_status_says_when_there_are_none_or_it_cannot_ask(
    tmp_path, shell, capsys, monkeypatch
):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        as_user(monkeypatch, svc, alice)
        out = await gpulab(shell, capsys)
        assert "Alerts: No alerts in the last 24 h" in out, out

    # No service there: the status still prints, the alert line says why in one line.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("GPULAB_API_URL", f"http://127.0.0.1:{port}/services/gpulab/api/v1")
    out = await gpulab(shell, capsys)
    assert "GPU: 1/4 GPU on " in out, out
    assert "Alerts are not available: no answer from the gpulab service" in out, out
    assert "Traceback" not in out
    # Outside a server gpulab started: no API, no alert line.
    monkeypatch.delenv("GPULAB_API_URL")
    out = await gpulab(shell, capsys)
    assert "API: not set" in out and "Alerts" not in out, out


async def test_alerts_subcommand_lists_firing_and_with_all_the_resolved(
    tmp_path, shell, capsys, monkeypatch
):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        seed(svc, ALERTS)
        as_user(monkeypatch, svc, alice)
        out = await gpulab(shell, capsys, "alerts")
        rows = out.splitlines()
        assert rows[0].split() == ["severity", "state", "alert", "subject", "when", "message"]
        assert len(rows) == 4, out  # header, rule, JobStalled, how to acknowledge it
        assert rows[2].split()[:3] == ["critical", "firing", "JobStalled"]
        assert rows[2].split()[4:6] == ["job", "3f2a1b9c0d1e"]
        assert rows[2].split()[3].startswith("#")  # the id --ack takes
        assert "since 5 min ago" in rows[2] and "see its log" in rows[2]
        assert rows[3] == "seen one? %gpulab alerts --ack ID (the # in its alert column)"

        out = await gpulab(shell, capsys, "alerts --all")
        rows = out.splitlines()[2:4]
        assert [r.split()[2] for r in rows] == ["JobStalled", "JobFailed"], out
        assert "resolved 43 min ago, lasted 2 min" in rows[1]

        # An admin's table names owners; shared things have none.
        as_user(monkeypatch, svc, svc.admin_token)
        out = await gpulab(shell, capsys, "alerts")
        assert "owner" in out.splitlines()[0] and "(shared)" in out and " bob " in out, out

        out = await gpulab(shell, capsys, "alerts --resolved")
        assert "unknown argument --resolved" in out and "usage: %gpulab alerts" in out


async def test_alerts_subcommand_when_none_fire(tmp_path, shell, capsys, monkeypatch):
    async with serve(tmp_path) as svc:
        bob = svc.create_user("bob")
        seed(svc, [a for a in ALERTS if a["owner"] != "bob"])
        as_user(monkeypatch, svc, bob)
        out = await gpulab(shell, capsys, "alerts")
        assert out.startswith("No alerts firing"), out
        out = await gpulab(shell, capsys, "alerts --all")
        assert out.strip() == "No alerts in the last 24 h"


def test_help_lists_the_alerts_subcommand(shell, capsys):
    shell.run_line_magic("gpulab", "help")
    out = capsys.readouterr().out
    assert "%gpulab alerts [--all]" in out and "Alerts" in out
