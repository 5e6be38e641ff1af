"""A JupyterHub in pods, shaped as z2jh's chart makes it, for the live cluster.

z2jh's chart cannot be downloaded here, so its objects are written out for the
parts gpulab meets (the names and ports its wiring names): a ``hub`` Deployment
with its ServiceAccount and Role (z2jh's rights: pods, claims, secrets,
services, events), the ``hub`` Service (8081), a ``proxy`` Deployment of
configurable-http-proxy with ``proxy-api`` (8001) and ``proxy-public`` (80)
Services. The hub container takes gpulab's part exactly as a site gives it to
z2jh: ``hub.extraEnv``, ``hub.extraVolumes`` and ``hub.extraVolumeMounts`` of
``helm/gpulab/z2jh-values.yaml`` (the ``gpulab-hub-config`` ConfigMap and the
``gpulab-tokens`` Secret the gpulab chart made), its ``hub.config`` (the notebook
containers' security context) applied as z2jh's file applies it, and its
``jupyterhub_config.py`` loads ``jupyterhub_config.d/`` as z2jh's does.

What stands in for images: the suite's Python image with this machine's ``/usr``
(node, for the proxy) and the checkout (its venv: jupyterhub, gpulab,
configurable-http-proxy under ``node_modules``) mounted read-only at the same paths.
"""

from __future__ import annotations

import copy
import json
import sysconfig
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
Z2JH_VALUES = REPO / "helm" / "gpulab" / "z2jh-values.yaml"
CHP = REPO / "node_modules" / "configurable-http-proxy" / "bin" / "configurable-http-proxy"
LIBS = f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"
HUB_PORT, PROXY_API_PORT, PROXY_PORT = 8081, 8001, 8000
#: The hub's own configuration, as z2jh's jupyterhub_config.py sets these parts.
HUB_CONFIG = """\
import glob
import json
import os

c = get_config()  # noqa: F821
c.JupyterHub.hub_bind_url = "http://:8081"
c.JupyterHub.hub_connect_url = "http://hub:8081"
c.ConfigurableHTTPProxy.api_url = "http://proxy-api:8001"
c.ConfigurableHTTPProxy.should_start = False
c.JupyterHub.cleanup_servers = False
c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
# The suite's way in: a service whose token may make users and their tokens.
c.JupyterHub.services = [{"name": "suite", "api_token": os.environ["SUITE_ADMIN_TOKEN"]}]
c.JupyterHub.load_roles = [
    {"name": "suite", "scopes": ["admin:users", "tokens"], "services": ["suite"]}
]
# z2jh's singleuser values, as its file turns them into KubeSpawner's settings: the
# suite's image with this machine's venv (jupyterhub-singleuser) and libraries.
c.KubeSpawner.namespace = os.environ["POD_NAMESPACE"]
c.KubeSpawner.image = os.environ["SINGLEUSER_IMAGE"]
c.KubeSpawner.image_pull_policy = "Never"
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.uid = 1000
c.KubeSpawner.environment = {"PATH": os.environ["PATH"], "HOME": "/tmp", "USER": "jovyan"}
c.KubeSpawner.volumes = [
    {"name": n, "hostPath": {"path": p, "type": "Directory"}}
    for n, p in (("gpulab-venv", os.environ["VENV_ROOT"]), ("host-libs", os.environ["HOST_LIBS"]))
]
c.KubeSpawner.volume_mounts = [
    {"name": "gpulab-venv", "mountPath": os.environ["VENV_ROOT"], "readOnly": True},
    {"name": "host-libs", "mountPath": os.environ["HOST_LIBS"], "readOnly": True},
]
c.KubeSpawner.start_timeout = 120
# python as PID 1 ignores SIGTERM: a stopped server would take its 30 s.
c.KubeSpawner.extra_pod_config = {"terminationGracePeriodSeconds": 1}
# z2jh's hub.config, as its file applies it: z2jh-values.yaml's (the notebook
# containers' security context).
for section, settings in json.loads(os.environ.get("Z2JH_HUB_CONFIG", "{}")).items():
    for name, value in settings.items():
        setattr(c[section], name, value)
# As z2jh's file does: each of jupyterhub_config.d/ run in this file's namespace (the
# same config: what gpulab's file adds keeps the services and roles set above).
for path in sorted(glob.glob("/usr/local/etc/jupyterhub/jupyterhub_config.d/*.py")):
    with open(path) as f:
        exec(compile(source=f.read(), filename=os.path.basename(path), mode="exec"))
"""


def _host_mounts(container: dict, spec: dict, usr: str) -> None:
    """The checkout (its venv) and this machine's ``usr`` (``/usr``: node; or only its
    shared libraries, which the venv's compiled modules load), read-only at the same
    paths."""
    volumes = [
        {"name": "gpulab-venv", "hostPath": {"path": str(REPO), "type": "Directory"}},
        {"name": "host-usr", "hostPath": {"path": usr, "type": "Directory"}},
    ]
    mounts = [
        {"name": "gpulab-venv", "mountPath": str(REPO), "readOnly": True},
        {"name": "host-usr", "mountPath": usr, "readOnly": True},
    ]
    spec.setdefault("volumes", []).extend(volumes)
    container.setdefault("volumeMounts", []).extend(mounts)
    container.setdefault("env", []).append(
        {"name": "PATH", "value": f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    )


def _env(values: dict) -> list[dict]:
    """z2jh's ``hub.extraEnv`` (a map of name to value or EnvVar body) as EnvVars."""
    out = []
    for name, value in values.items():
        out.append(
            {"name": name, **value} if isinstance(value, dict) else {"name": name, "value": value}
        )
    return out


def _deployment(name: str, component: str, spec: dict) -> dict:
    labels = {"app": "jupyterhub", "component": component}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def _service(name: str, component: str, port: int, target: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": "jupyterhub", "component": component},
            "ports": [{"port": port, "targetPort": target, "protocol": "TCP"}],
        },
    }


def objects(image: str, proxy_token: str, admin_token: str) -> list[dict]:
    """The hub's and the proxy's objects, in the order to create them."""
    z2jh = yaml.safe_load(Z2JH_VALUES.read_text())["hub"]
    hub_rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
            "verbs": ["get", "watch", "list", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
    ]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hub"},
        "stringData": {
            "hub.config.ConfigurableHTTPProxy.auth_token": proxy_token,
            "suite-admin-token": admin_token,
        },
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hub"},
        "data": {"jupyterhub_config.py": HUB_CONFIG},
    }
    proxy_token_env = {
        "name": "CONFIGPROXY_AUTH_TOKEN",
        "valueFrom": {
            "secretKeyRef": {"name": "hub", "key": "hub.config.ConfigurableHTTPProxy.auth_token"}
        },
    }
    hub = {
        "name": "hub",
        "image": image,
        "imagePullPolicy": "Never",
        "command": [
            "jupyterhub",
            "--config=/usr/local/etc/jupyterhub/jupyterhub_config.py",
            "--upgrade-db",
        ],
        "ports": [{"name": "http", "containerPort": HUB_PORT}],
        "env": [
            proxy_token_env,
            {
                "name": "SUITE_ADMIN_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "hub", "key": "suite-admin-token"}},
            },
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "SINGLEUSER_IMAGE", "value": image},
            {"name": "VENV_ROOT", "value": str(REPO)},
            {"name": "HOST_LIBS", "value": LIBS},
            {"name": "Z2JH_HUB_CONFIG", "value": json.dumps(z2jh.get("config") or {})},
            *_env(z2jh["extraEnv"]),
        ],
        "volumeMounts": [
            {
                "name": "config",
                "mountPath": "/usr/local/etc/jupyterhub/jupyterhub_config.py",
                "subPath": "jupyterhub_config.py",
            },
            {"name": "hub-db", "mountPath": "/srv/jupyterhub"},
            *copy.deepcopy(z2jh["extraVolumeMounts"]),
        ],
        "readinessProbe": {"httpGet": {"path": "/hub/health", "port": "http"}, "periodSeconds": 2},
    }
    hub_spec = {
        "serviceAccountName": "hub",
        "terminationGracePeriodSeconds": 1,
        "containers": [hub],
        "volumes": [
            {"name": "config", "configMap": {"name": "hub"}},
            {"name": "hub-db", "emptyDir": {}},
            *copy.deepcopy(z2jh["extraVolumes"]),
        ],
    }
    # Not all of /usr: z2jh's mounts go under /usr/local/etc/jupyterhub, which a
    # read-only /usr would refuse.
    _host_mounts(hub, hub_spec, usr=LIBS)
    chp = {
        "name": "chp",
        "image": image,
        "imagePullPolicy": "Never",
        "command": [
            "node",
            str(CHP),
            "--ip=0.0.0.0",
            f"--port={PROXY_PORT}",
            "--api-ip=0.0.0.0",
            f"--api-port={PROXY_API_PORT}",
            "--default-target=http://hub:$(HUB_SERVICE_PORT)",
            "--error-target=http://hub:$(HUB_SERVICE_PORT)/hub/error",
        ],
        "ports": [
            {"name": "http", "containerPort": PROXY_PORT},
            {"name": "api", "containerPort": PROXY_API_PORT},
        ],
        "env": [proxy_token_env],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 2},
    }
    proxy_spec = {"terminationGracePeriodSeconds": 1, "containers": [chp]}
    _host_mounts(chp, proxy_spec, usr="/usr")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "hub"},
            "rules": hub_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "hub"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub"}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
        },
        secret,
        config,
        # Services first: their variables (HUB_SERVICE_PORT) reach pods made after them.
        _service("hub", "hub", HUB_PORT, HUB_PORT),
        _service("proxy-api", "proxy", PROXY_API_PORT, PROXY_API_PORT),
        _service("proxy-public", "proxy", 80, PROXY_PORT),
        # The proxy first: the hub asks it for its routes as it starts.
        _deployment("proxy", "proxy", proxy_spec),
        _deployment("hub", "hub", hub_spec),
    ]


def service_values(image: str) -> dict:
    """The gpulab chart's values that run its service pod here, as a second release
    in the cluster: the suite's image with this machine's venv, and endpoints'
    replicas given the venv as well (:mod:`.venv_serving`)."""
    name, _, tag = image.rpartition(":")
    venv_bin = REPO / ".venv" / "bin"
    return {
        "service": {
            "image": {"repository": name, "tag": tag, "pullPolicy": "Never"},
            "persistence": {"size": "1Gi"},
            "extraEnv": [
                {"name": "PATH", "value": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"},
                {"name": "PYTHONPATH", "value": str(Path(__file__).parent)},
                {"name": "HOME", "value": "/tmp"},
            ],
            "extraVolumes": [
                {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
                {"name": "gpulab-venv", "hostPath": {"path": str(REPO), "type": "Directory"}},
            ],
            "extraVolumeMounts": [
                {"name": "host-usr", "mountPath": "/usr", "readOnly": True},
                {"name": "gpulab-venv", "mountPath": str(REPO), "readOnly": True},
            ],
            "extraConfig": (
                'c.GpuLabService.serving_backend_class = "venv_serving.VenvKubernetesServing"\n'
            ),
        },
        "deployments": {
            "kubernetes": {"image": {"name": name, "tag": tag}},
            "storage": {"size": "1Gi"},
        },
        "jobs": {"storage": {"size": "1Gi"}},
        # A second release in the cluster: the first one's PriorityClasses (cluster-wide)
        # stay its own; helm refuses to take them over.
        "priorityClasses": {"create": False},
        "notebookPriorityClass": {"create": False},
    }
