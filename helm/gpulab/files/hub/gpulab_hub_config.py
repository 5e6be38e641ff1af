# gpulab's part of the hub configuration, loaded by z2jh's jupyterhub_config.py
# from /usr/local/etc/jupyterhub/jupyterhub_config.d/. It reads the chart's
# values from a JSON file the chart mounts beside it; nothing here is pasted
# into values.yaml. The hub image needs gpulab installed (`pip install gpulab[kubernetes]`).
import json
import os

c = get_config()  # noqa: F821 (provided by JupyterHub)

with open(os.environ.get("GPULAB_HUB_VALUES", "/usr/local/etc/gpulab/hub-values.json")) as f:
    gpulab = json.load(f)

service_name = gpulab["serviceName"]
agent_name = gpulab["agentServiceName"]
service_token = os.environ["GPULAB_SERVICE_TOKEN"]
access_service = f"access:services!service={service_name}"

c.JupyterHub.spawner_class = "gpulab-kube"
c.FractionalKubeSpawner.gpulab_api_url = gpulab["apiUrl"]
c.FractionalKubeSpawner.gpulab_public_api_url = gpulab["publicApiUrl"]
c.FractionalKubeSpawner.gpulab_api_token = service_token
c.FractionalKubeSpawner.enforcement = gpulab["enforcement"]["backend"]
c.FractionalKubeSpawner.enforcement_options = gpulab["enforcement"].get("options") or {}
c.FractionalKubeSpawner.notebook_priority_class = gpulab.get("notebookPriorityClass") or ""
# Servers' own tokens may call the gpulab API as their user (magics, widgets).
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", access_service]


def _add_service(services, service):
    return [s for s in services if s.get("name") != service["name"]] + [service]


services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
services = _add_service(
    services,
    {
        "name": service_name,
        "url": gpulab["serviceUrl"],
        "api_token": service_token,
        "display": True,
        "oauth_no_confirm": True,
    },
)
# The node agents push telemetry as their own service (no URL: API only).
services = _add_service(
    services, {"name": agent_name, "api_token": os.environ["GPULAB_AGENT_TOKEN"]}
)
c.JupyterHub.services = services

existing_roles = c.JupyterHub.load_roles if "load_roles" in c.JupyterHub else []
roles = {r["name"]: dict(r) for r in existing_roles}
user = roles.setdefault("user", {"name": "user", "scopes": ["self"]})
user["scopes"] = sorted(set(user.get("scopes") or ["self"]) | {access_service})
roles["gpulab-service"] = {
    "name": "gpulab-service",
    "services": [service_name],
    "scopes": [
        "list:users",
        "read:users",
        "read:servers",
        # stops servers whose GPU idles (c.GpuLabService.gpu_idle_cull_seconds)
        "delete:servers",
        "list:groups",
        "read:groups",
        access_service,
    ],
}
c.JupyterHub.load_roles = list(roles.values())

# The admin page's "GPU slices" table, above JupyterHub's user list.
from gpulab.hub_ext.admin_page import show_slices_on_admin_page  # noqa: E402

show_slices_on_admin_page(c)

# The audit trail's hub events (logins, server starts and stops, admin actions).
from gpulab.hub_ext.audit_hook import configure_audit  # noqa: E402

configure_audit(c, gpulab["apiUrl"], service_token, service_name)
