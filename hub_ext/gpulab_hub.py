"""gpulab's part of a JupyterHub configuration, written once for both hubs gpulab runs.

``gpulab up`` (:func:`gpulab.hub_ext.hub_config.configure`) and the Helm chart's
``files/hub/gpulab_hub_config.py`` (loaded by z2jh's hub) both call
:func:`add_gpulab_to_hub`; they differ only in what they pass: ``gpulab up`` has the
hub start the service (``service_command``) and samples telemetry in the service
itself, the chart points at the service's pod and registers the node agents'
service. Everything else (the services' roles, the scopes of servers' tokens, the
admin page, the audit hook) is the same on both, so it lives here.

A site's own services and roles are kept: z2jh has set its own (its idle culler)
before it loads ``jupyterhub_config.d``, and ``gpulab up`` adds its culler after.
"""

from __future__ import annotations

from gpulab.hub_ext.admin_page import show_slices_on_admin_page
from gpulab.hub_ext.audit_hook import configure_audit
from gpulab.hub_ext.held_elsewhere import offer_to_stop_what_else_is_held
from gpulab.hub_ext.server_tokens import SCOPE as SERVER_TOKENS_SCOPE
from gpulab.hub_ext.server_tokens import mint_server_tokens


def service_access(service_name: str) -> str:
    """The scope that lets a token call the service (its REST API, its pages)."""
    return f"access:services!service={service_name}"


def gpulab_service_scopes(service_name: str) -> list[str]:
    """What the gpulab service's own token may do on the hub (``service/hubapi.py``)."""
    return [
        # who is asking: the user's admin flag and groups (service/auth.py)
        "list:users",
        "read:users",
        # which servers run: the reconciler and the ledger guard release dead ones' slices
        "read:servers",
        # stops servers: GPU-idle culling (c.Thresholds.gpu_idle_cull_seconds) and
        # an admin's forced release of a running server's slice (ledger guard)
        "delete:servers",
        # hibernation asks a server's kernels to save themselves (service/hibernation/)
        # with a token the hub mints per call, scoped to that one server and owned by
        # its user (hub_ext/server_tokens.py): the user's server process never sees
        # this token, and this role holds no access:servers of its own
        SERVER_TOKENS_SCOPE,
        # group quotas and sharing (service/sharing.py)
        "list:groups",
        "read:groups",
        service_access(service_name),
    ]


def server_token_scopes(service_name: str) -> list[str]:
    """Servers' own tokens may call the gpulab API as their user (magics, widgets, lab)."""
    return ["users:activity!user", "access:servers!server", service_access(service_name)]


def add_service(c, service: dict) -> None:
    """Register ``service`` in hub config ``c``, replacing one of the same name only."""
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    c.JupyterHub.services = [s for s in services if s.get("name") != service["name"]] + [service]


def add_role(c, role: dict) -> None:
    """Define ``role`` in hub config ``c``, replacing one of the same name only."""
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != role["name"]] + [role]


def grant_to_users(c, scopes: list[str]) -> None:
    """Add ``scopes`` to the ``user`` role every user has, keeping what a site gave it
    (JupyterHub's default for the role is ``["self"]``)."""
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    user = next((dict(r) for r in roles if r.get("name") == "user"), {"name": "user"})
    user["scopes"] = sorted(set(user.get("scopes") or ["self"]) | set(scopes))
    if any(r.get("name") == "user" for r in roles):
        c.JupyterHub.load_roles = [user if r.get("name") == "user" else r for r in roles]
    else:
        c.JupyterHub.load_roles = [*roles, user]


def add_gpulab_to_hub(
    c,
    *,
    service_name: str,
    service_url: str,
    api_url: str,
    service_token: str,
    service_command: list[str] | None = None,
    service_environment: dict[str, str] | None = None,
    agent_service_name: str = "",
    agent_token: str = "",
) -> None:
    """Write gpulab's services, roles and hub hooks into hub config ``c``.

    ``service_url``: where the hub's proxy reaches the service
    (``http://gpulab.hub.svc:10101``); ``api_url``: its API as the hub process calls
    it (the audit trail's entries go there); ``service_command``: the hub starts and
    restarts the service itself (``gpulab up``), else it runs elsewhere (a pod).
    ``agent_service_name`` and ``agent_token``: node agents that push telemetry as a
    service of their own (no URL: the hub's API only; the chart's DaemonSet).
    """
    add_service(
        c,
        managed_service(
            service_name, service_url, service_token, service_command, service_environment
        ),
    )
    if agent_service_name:
        add_service(c, {"name": agent_service_name, "api_token": agent_token})

    grant_to_users(c, [service_access(service_name)])
    add_role(
        c,
        {
            "name": "gpulab-service",
            "services": [service_name],
            "scopes": gpulab_service_scopes(service_name),
        },
    )
    c.Spawner.server_token_scopes = server_token_scopes(service_name)
    # The service's calls into users' servers carry a token minted per call.
    mint_server_tokens(c)

    # The admin page's "GPU slices" table, above JupyterHub's user list.
    show_slices_on_admin_page(c)
    # The home page says what else the user holds (endpoints, jobs) and stops it.
    offer_to_stop_what_else_is_held(c)
    # The audit trail's hub events (logins, server starts and stops, admin actions).
    configure_audit(c, api_url, service_token, service_name)


def managed_service(name, url, token, command=None, environment=None) -> dict:
    """A hub service users log in to (OAuth without a confirmation page), started by
    the hub when ``command`` is given (the chart runs it as a Deployment instead)."""
    service = {
        "name": name,
        "url": url,
        "api_token": token,
        "display": True,
        "oauth_no_confirm": True,
    }
    if command:
        service["command"] = list(command)
        service["environment"] = dict(environment or {})
    return service


#: The hub's name of the MLflow service (``<hub>/services/mlflow``).
MLFLOW_SERVICE_NAME = "mlflow"


def add_mlflow_to_hub(
    c,
    *,
    service_url: str,
    service_token: str,
    gpulab_service_name: str,
    service_command: list[str] | None = None,
    service_environment: dict[str, str] | None = None,
) -> None:
    """MLflow's tracking server behind the hub (``gpulab.service.experiments``).

    Users (their OAuth logins, their own tokens and their servers' tokens) may call it;
    its own token may read users (the admin flag); the gpulab service may call it too,
    to record jobs' runs in their users' names. Call after :func:`add_gpulab_to_hub`.
    """
    access = service_access(MLFLOW_SERVICE_NAME)
    add_service(
        c,
        managed_service(
            MLFLOW_SERVICE_NAME, service_url, service_token, service_command, service_environment
        ),
    )
    add_role(
        c, {"name": "gpulab-mlflow", "services": [MLFLOW_SERVICE_NAME], "scopes": ["read:users"]}
    )
    grant_to_users(c, [access])
    # MLFLOW_TRACKING_TOKEN in a server is the server's own token.
    c.Spawner.server_token_scopes = sorted({*c.Spawner.server_token_scopes, access})
    roles = list(c.JupyterHub.load_roles)
    for role in roles:
        if role.get("services") == [gpulab_service_name]:
            role["scopes"] = sorted({*role.get("scopes", []), access})
    c.JupyterHub.load_roles = roles
