"""gpulab's part of a hub configuration (hub_ext/gpulab_hub.py): one function, the same
services' roles and scopes on `gpulab up`'s hub and the Helm chart's, a site's own kept."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml
from traitlets.config import Config
from up_config import up_config

from gpulab.hub_ext import audit_hook, server_tokens
from gpulab.hub_ext.admin_page import HUB_PAGES
from gpulab.hub_ext.gpulab_hub import add_gpulab_to_hub

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpulab"


def chart_config(tmp_path, monkeypatch, c: Config) -> Config:
    """The chart's files/hub/gpulab_hub_config.py, run on the values it renders, as
    z2jh's hub loads it from jupyterhub_config.d."""
    with helm.Chart.load(str(CHART)) as chart:
        # MLflow on, as `gpulab up` has it.
        values = {"jupyterhub": {"enabled": False}, "mlflow": {"enabled": True}}
        out = chart.render(values, name="gpulab", namespace="hub")
    data = yaml.safe_load(out["gpulab/templates/configmap-hub.yaml"])["data"]
    values = tmp_path / "hub-values.json"
    values.write_text(data["hub-values.json"])
    monkeypatch.setenv("GPULAB_HUB_VALUES", str(values))
    monkeypatch.setenv("GPULAB_SERVICE_TOKEN", "svc-token")
    monkeypatch.setenv("GPULAB_AGENT_TOKEN", "agent-token")
    monkeypatch.setenv("GPULAB_MLFLOW_TOKEN", "mlflow-token")
    source = data["gpulab_hub_config.py"]
    exec(compile(source, "gpulab_hub_config.py", "exec"), {"get_config": lambda: c})
    return c


def by_name(items) -> dict[str, dict]:
    return {x["name"]: x for x in items}


@pytest.fixture
def both(tmp_path, monkeypatch) -> tuple[Config, Config]:
    monkeypatch.setenv("GPULAB_DEMO_LOGIN", "0")
    return up_config(tmp_path), chart_config(tmp_path, monkeypatch, Config())


def test_both_hubs_give_the_service_and_servers_the_same_scopes(both):
    up, chart = both
    up_roles, chart_roles = by_name(up.JupyterHub.load_roles), by_name(chart.JupyterHub.load_roles)
    access = "access:services!service=gpulab"
    mlflow = "access:services!service=mlflow"
    users = {"name": "user", "scopes": [access, mlflow, "self"]}
    assert up_roles["user"] == chart_roles["user"] == users
    assert up_roles["gpulab-service"] == chart_roles["gpulab-service"]
    scopes = chart_roles["gpulab-service"]["scopes"]
    # The reconciler, the ledger guard (an admin's forced release stops the server),
    # GPU-idle culling and group quotas call the hub with these.
    assert {"read:servers", "delete:servers", "list:groups", "read:users", access} <= set(scopes)
    # Calls into users' servers carry a token the hub mints per call (hub_ext/server_tokens):
    # the service's own token reaches no server.
    assert server_tokens.SCOPE in scopes
    assert not [s for s in scopes if s.startswith(("access:servers", "tokens", "admin"))]
    assert up.Spawner.server_token_scopes == chart.Spawner.server_token_scopes
    # MLFLOW_TRACKING_TOKEN in a server is the server's own token: it reaches MLflow.
    assert chart.Spawner.server_token_scopes == sorted(
        ["users:activity!user", "access:servers!server", access, mlflow]
    )
    # MLflow's service reads users (the admin flag); the gpulab service writes jobs' runs.
    assert up_roles["gpulab-mlflow"] == chart_roles["gpulab-mlflow"]
    assert up_roles["gpulab-mlflow"]["scopes"] == ["read:users"]
    assert mlflow in scopes
    for c in both:
        assert c.JupyterHub.template_paths == [HUB_PAGES]
        assert c.JupyterHub.tornado_settings["log_function"] is audit_hook.log_request
        assert server_tokens.SCOPE in c.JupyterHub.custom_scopes
        routes = dict(c.JupyterHub.extra_handlers)
        assert routes[server_tokens.ROUTE] is server_tokens.ServerTokensHandler


def test_the_hubs_differ_in_who_runs_the_service_and_the_agents(both):
    up, chart = both
    up_services = by_name(up.JupyterHub.services)
    chart_services = by_name(chart.JupyterHub.services)
    # gpulab up: the hub starts the service and culls idle servers itself; no node agents.
    assert set(up_services) == {"gpulab", "idle-culler", "mlflow"}
    assert up_services["mlflow"]["command"][-2:] == ["-m", "gpulab.service.experiments"]
    # ... and its Ctrl-C stops the work too; the chart's service leaves it running.
    assert up_services["gpulab"]["command"][-3:] == [
        "-m",
        "gpulab.service",
        "--GpuLabService.stop_work_on_exit=True",
    ]
    assert "GPULAB_DATA_DIR" in up_services["gpulab"]["environment"]
    assert by_name(up.JupyterHub.load_roles)["idle-culler"]["services"] == ["idle-culler"]
    # The chart: the service is a pod of its own; z2jh culls; the agents push telemetry.
    assert set(chart_services) == {"gpulab", "gpulab-agent", "mlflow"}
    assert chart_services["mlflow"]["url"] == "http://gpulab-mlflow.hub.svc:10102"
    assert chart.FractionalKubeSpawner.mlflow_tracking_uri == (
        "http://proxy-public.hub.svc/services/mlflow"
    )
    assert chart_services["gpulab"] == {
        "name": "gpulab",
        "url": "http://gpulab.hub.svc:10101",
        "api_token": "svc-token",
        "display": True,
        "oauth_no_confirm": True,
    }
    assert chart_services["gpulab-agent"] == {"name": "gpulab-agent", "api_token": "agent-token"}
    shown = {"display", "oauth_no_confirm"}
    assert {k: up_services["gpulab"][k] for k in shown} == {k: True for k in shown}


def site_config() -> Config:
    """A site's own services and roles, set before gpulab's part (z2jh's culler)."""
    c = Config()
    c.JupyterHub.services = [
        {"name": "idle-culler", "command": ["cull"]},
        {"name": "gpulab", "url": "http://stale:1"},
    ]
    c.JupyterHub.load_roles = [
        {"name": "user", "scopes": ["self", "read:groups"]},
        {"name": "jupyterhub-idle-culler", "services": ["idle-culler"], "scopes": ["list:users"]},
        {"name": "gpulab-service", "services": ["gpulab"], "scopes": ["admin:users"]},
    ]
    c.JupyterHub.template_paths = ["/etc/site-pages"]
    c.JupyterHub.tornado_settings = {"cookie_options": {"secure": True}}
    return c


def add(c: Config) -> None:
    add_gpulab_to_hub(
        c,
        service_name="gpulab",
        service_url="http://gpulab:10101",
        api_url="http://gpulab:10101/services/gpulab/api/v1",
        service_token="svc-token",
        agent_service_name="gpulab-agent",
        agent_token="agent-token",
    )


def test_a_sites_own_services_and_roles_are_kept():
    c = site_config()
    add(c)
    add(c)  # a second load (z2jh and a site's copy of the file) changes nothing
    assert [s["name"] for s in c.JupyterHub.services] == ["idle-culler", "gpulab", "gpulab-agent"]
    assert c.JupyterHub.services[0] == {"name": "idle-culler", "command": ["cull"]}
    assert c.JupyterHub.services[1]["url"] == "http://gpulab:10101"
    roles = by_name(c.JupyterHub.load_roles)
    assert [r["name"] for r in c.JupyterHub.load_roles] == [
        "user",
        "jupyterhub-idle-culler",
        "gpulab-service",
    ]
    # The site's grant to every user stays; gpulab adds access to its service.
    assert roles["user"]["scopes"] == ["access:services!service=gpulab", "read:groups", "self"]
    assert roles["jupyterhub-idle-culler"]["scopes"] == ["list:users"]
    # gpulab's own role is gpulab's: a stale copy of it is replaced, not widened.
    assert "admin:users" not in roles["gpulab-service"]["scopes"]
    assert c.JupyterHub.template_paths == ["/etc/site-pages", HUB_PAGES]
    assert c.JupyterHub.tornado_settings["cookie_options"] == {"secure": True}


def test_the_chart_keeps_a_sites_services_and_roles(tmp_path, monkeypatch):
    c = chart_config(tmp_path, monkeypatch, site_config())
    assert [s["name"] for s in c.JupyterHub.services] == [
        "idle-culler",
        "gpulab",
        "gpulab-agent",
        "mlflow",
    ]
    roles = by_name(c.JupyterHub.load_roles)
    assert "jupyterhub-idle-culler" in roles
    assert roles["user"]["scopes"] == [
        "access:services!service=gpulab",
        "access:services!service=mlflow",
        "read:groups",
        "self",
    ]
