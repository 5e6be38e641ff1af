"""What ``%gpulab`` shows, without a hub: one output, a table in JupyterLab and the
same lines as before it had HTML everywhere else (a terminal, nbconvert, papermill,
``GPULAB_DISPLAY=text``). The pools and the alerts are the service's answers, here
stood in for (their words: tests/magics/test_pools_text.py and
tests/widgets/test_gpulab_alerts_magic.py, against the real service)."""

import os

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from test_pools_text import TWO

import gpulab.magics.alerts as alerts
import gpulab.magics.pools as pools
from gpulab.magics.status import DEMO_LOGIN_WARNING, slice_status, status_bundle
from gpulab.widgets.model import AlertsModel

API = "http://127.0.0.1:1/services/gpulab/api/v1"
#: What a server gpulab started on a simulated GPU, in demo mode, as one account, has.
ENV = {
    "GPULAB_GPU_MILLI": "250",
    "GPULAB_GPU_UUID": "GPU-<b>1</b>",
    "GPULAB_GPU_SIMULATED": "1",
    "GPULAB_GPU_ENFORCEMENT": "none: a simulated GPU",
    "GPULAB_LIMITS": "cgroup v1: 2 CPUs & 16 GiB",
    "GPULAB_API_URL": API + "?a=<x>",
    "GPULAB_DEMO_LOGIN": "1",
    "GPULAB_SINGLE_ACCOUNT": "<jovyan>",
}
#: The text %gpulab printed before it had a table, line for line.
TEXT = [
    "GPU: 1/4 GPU on GPU-<b>1</b> (simulated: nothing enforced)",
    "Held by: none: a simulated GPU",
    "Limits: cgroup v1: 2 CPUs & 16 GiB",
    f"API: {API}?a=<x>",
    DEMO_LOGIN_WARNING,
    "Single account: every user's code runs as <jovyan>; users are not separated on this host.",
    "Pools: box (local) full; slurm 1/4 GPU x16, 1 GPU x4; jobs go to the first with room",
    "Alerts: No alerts in the last 24 h",
]


@pytest.fixture
def service(monkeypatch):
    """The service's answers: two pools, no alerts."""
    monkeypatch.setattr(pools, "_fetch", lambda timeout=None: TWO)
    monkeypatch.setattr(alerts, "_fetch", lambda state, timeout=None: quiet_alerts())


def quiet_alerts() -> AlertsModel:
    m = AlertsModel()
    m.ingest({"alerts": [], "firing": 0}, 0.0)
    return m


@pytest.fixture
def shell(monkeypatch):
    for name in [n for n in os.environ if n.startswith("GPULAB_")]:
        monkeypatch.delenv(name)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    return ip


def test_the_text_is_the_lines_users_had_and_the_table_has_a_row_each(service):
    bundle = status_bundle(ENV)
    assert bundle["text/plain"].splitlines() == TEXT
    assert slice_status(ENV).splitlines() == TEXT[:6]  # the slice's part, as the hub tests read
    html = bundle["text/html"]
    assert html.startswith('<table class="gpulab-status"')
    for label in ("GPU", "Held by", "Limits", "API", "Pools", "Alerts"):
        assert f"{label}:</th>" in html, label
    assert "<b>1/4 GPU</b> on <code>GPU-&lt;b&gt;1&lt;/b&gt;</code>" in html
    assert "(simulated: nothing enforced)" in html
    assert "cgroup v1: 2 CPUs &amp; 16 GiB" in html and "?a=&lt;x&gt;" in html
    assert "<b>slurm</b> 1/4 GPU x16, 1 GPU x4" in html  # a pool a line
    # The warnings are marked as such, under the rows, with everything escaped.
    warnings = html.split('<tr class="gpulab-warning">')[1:]
    assert len(warnings) == 2 and "&#9888; Demo login: anyone" in warnings[0]
    assert "runs as &lt;jovyan&gt;" in warnings[1]
    assert "<jovyan>" not in html and "<x>" not in html and "<b>1</b>" not in html


def test_without_a_gpu_or_the_service_there_is_no_pools_or_alerts_row():
    bundle = status_bundle({})
    assert bundle["text/plain"] == (
        "GPU: no GPU slice\nAPI: not set (this server was not started by gpulab)"
    )
    assert bundle["text/html"].count("<tr>") == 2 and "gpulab-warning" not in bundle["text/html"]


def test_a_service_that_does_not_answer_is_one_row_each(monkeypatch):
    def down(*args, **kwargs):
        raise OSError("connection refused")

    def unavailable(state, timeout=None):
        m = AlertsModel()
        m.fail("alerts are not available: no answer from the gpulab service")
        return m

    monkeypatch.setattr(pools, "_fetch", down)
    monkeypatch.setattr(alerts, "_fetch", unavailable)
    bundle = status_bundle({"GPULAB_API_URL": API})
    assert bundle["text/plain"].splitlines()[-2:] == [
        "Pools: could not ask the service (connection refused)",
        "Alerts are not available: no answer from the gpulab service",
    ]
    assert "not available: no answer from the gpulab service</span>" in bundle["text/html"]


def test_the_magic_shows_one_output_with_both_forms(service, shell):
    with capture_output() as shown:
        shell.run_line_magic("gpulab", "")
    assert shown.stdout == ""
    [output] = shown.outputs
    assert output.data["text/plain"].splitlines() == TEXT
    assert output.data["text/html"] == status_bundle(ENV)["text/html"]


def test_a_terminal_and_gpulab_display_text_get_the_text(service, shell, capsys, monkeypatch):
    shell.run_line_magic("gpulab", "")  # a terminal prints a display's text/plain
    assert capsys.readouterr().out.splitlines() == TEXT
    monkeypatch.setenv("GPULAB_DISPLAY", "text")
    with capture_output() as shown:
        shell.run_line_magic("gpulab", "")
    assert shown.outputs == [] and shown.stdout.splitlines() == TEXT


def test_firing_alerts_carry_the_dashboards_marker(monkeypatch):
    stalled = {
        "name": "JobStalled",
        "severity": "critical",
        "state": "firing",
        "subject_kind": "job",
        "subject": "<3f2a1b9c0d1e>",
        "owner": "alice",
        "message": "made no step for 10 min",
        "since": "2026-01-01T00:00:00Z",
    }

    def firing(state, timeout=None):
        m = AlertsModel()
        m.ingest({"alerts": [stalled], "firing": 1}, 0.0)
        return m

    monkeypatch.setattr(pools, "_fetch", lambda timeout=None: TWO)
    monkeypatch.setattr(alerts, "_fetch", firing)
    bundle = status_bundle({"GPULAB_API_URL": API})
    [line] = [x for x in bundle["text/plain"].splitlines() if x.startswith("Alerts:")]
    assert line.startswith("Alerts: [critical] 1 alert firing: JobStalled (job <3f2a1b9c0d1e>")
    html = bundle["text/html"]
    assert 'class="gpulab-alert-marker" data-severity="critical"' in html
    assert "JobStalled (job &lt;3f2a1b9c0d1e&gt;)" in html and "<3f2a" not in html
