"""JupyterHub configuration for the embedded platform (`gpulab up`).

:func:`configure` fills a hub config object from :class:`Settings`; the file
passed to ``jupyterhub -f`` (``jupyterhub_config.py`` beside this one) calls
it, then loads ``<data-dir>/gpulab_config.py`` so an operator can override
anything, e.g. another authenticator::

    c.JupyterHub.authenticator_class = "github"
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

SERVICE_NAME = "gpulab"
ADMIN_USER = "admin"


@dataclass
class Settings:
    data_dir: Path
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    service_port: int = 10101
    mlflow_port: int = 10102
    simulate_gpus: str = ""
    db_url: str = ""
    cull_idle_timeout: int = 3600
    # TLS: "self-signed" (gpulab's own CA) or the operator's certificate and key files.
    tls: str = ""
    ssl_cert: str = ""
    ssl_key: str = ""

    ENV = {
        "data_dir": "GPULAB_DATA_DIR",
        "ip": "GPULAB_IP",
        "port": "GPULAB_PORT",
        "hub_port": "GPULAB_HUB_PORT",
        "proxy_api_port": "GPULAB_PROXY_API_PORT",
        "service_port": "GPULAB_SERVICE_PORT",
        "mlflow_port": "GPULAB_MLFLOW_PORT",
        "simulate_gpus": "GPULAB_SIMULATE_GPUS",
        "db_url": "GPULAB_DB_URL",
        "cull_idle_timeout": "GPULAB_CULL_IDLE_TIMEOUT",
        "tls": "GPULAB_TLS",
        "ssl_cert": "GPULAB_SSL_CERT",
        "ssl_key": "GPULAB_SSL_KEY",
    }

    def to_env(self) -> dict[str, str]:
        return {env: str(getattr(self, attr)) for attr, env in self.ENV.items()}

    @classmethod
    def from_env(cls, env=os.environ) -> Settings:
        s = cls(data_dir=Path(env.get("GPULAB_DATA_DIR", ".gpulab")).resolve())
        for attr, name in cls.ENV.items():
            if attr != "data_dir" and name in env:
                kind = type(getattr(s, attr))
                setattr(s, attr, kind(env[name]))
        return s

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls or self.ssl_cert)

    @property
    def scheme(self) -> str:
        """Of every URL between the platform's parts, and of the public one."""
        return "https" if self.uses_tls else "http"

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0") else self.ip
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"


def secret_file(path: Path, nbytes: int = 32) -> str:
    """Read a secret from ``path``, creating it (mode 0600) on first use."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()


#: Files of the hub's state that older versions left with default modes.
STATE_FILES = (
    "jupyterhub.sqlite",
    "gpulab.sqlite",
    "jupyterhub_cookie_secret",
    "jupyterhub-proxy.pid",
    "hub.log",
    "gpulab_config.py",
    "ports.json",
)


def private_state(data: Path) -> None:
    for name in STATE_FILES:
        path = data / name
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)


def find_proxy() -> str:
    """configurable-http-proxy: on PATH, or installed by `make up` in node_modules."""
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        candidate = root / "node_modules" / ".bin" / "configurable-http-proxy"
        if candidate.exists():
            return str(candidate)
    raise SystemExit(
        "configurable-http-proxy not found: run `make up` (it installs it with "
        "npm) or `npm install -g configurable-http-proxy`"
    )


def configure_tls(c, s: Settings) -> list[Path]:
    """TLS on the public port and ``internal_ssl`` between the parts (:mod:`.tls`).

    Returns the CA files the platform's own processes trust beside the system's
    (none without TLS). Users' servers get the public port's CA as ``GPULAB_CA_FILE``
    where it is gpulab's own (``--tls self-signed``).
    """
    if not s.uses_tls:
        return []
    from . import tls

    public = tls.public_tls(s.data_dir, s.tls, s.ssl_cert, s.ssl_key, s.ip)
    c.JupyterHub.ssl_cert = str(public.cert)
    c.JupyterHub.ssl_key = str(public.key)
    c.JupyterHub.internal_ssl = True
    c.JupyterHub.internal_certs_location = str(tls.prepare_internal(s.data_dir))
    ca_files = [tls.internal_trust_bundle(s.data_dir)]
    if public.ca is not None:
        c.FractionalHostSpawner.gpulab_ca_file = str(public.ca)
        ca_files.insert(0, public.ca)
    # The hub's own calls to the service (spawns, the audit trail) trust the same CAs
    # (gpulab.client.tls reads them from the environment of the process that calls).
    os.environ["GPULAB_CA_FILE"] = os.pathsep.join(map(str, ca_files))
    return ca_files


def configure_mlflow(c, s: Settings, data: Path, service_env: dict, tls: bool) -> None:
    """The hub's ``mlflow`` service (:mod:`gpulab.service.experiments`), servers'
    MLFLOW_TRACKING_URI, and the gpulab service's address of it (jobs' runs)."""
    from .gpulab_hub import MLFLOW_SERVICE_NAME, add_mlflow_to_hub

    add_mlflow_to_hub(
        c,
        service_url=f"{s.scheme}://127.0.0.1:{s.mlflow_port}",
        service_token=secret_file(data / "mlflow-token"),
        gpulab_service_name=SERVICE_NAME,
        service_command=[sys.executable, "-m", "gpulab.service.experiments"],
        service_environment={
            "GPULAB_DATA_DIR": str(data),
            "GPULAB_DB_URL": s.db_url,
            **({"GPULAB_CA_FILE": service_env["GPULAB_CA_FILE"]} if tls else {}),
        },
    )
    c.FractionalHostSpawner.mlflow_tracking_uri = f"{s.public_url}/services/{MLFLOW_SERVICE_NAME}"


def configure(c, s: Settings) -> None:
    data = s.data_dir
    data.mkdir(parents=True, exist_ok=True)
    # The hub's state is private to it (umask 077 for the hub, the proxy and the
    # service). The data dir itself is 0711: users' accounts may pass through to
    # their own job, model and cache folders, but cannot list or open the rest.
    os.umask(0o077)
    os.chmod(data, 0o711 if os.geteuid() == 0 else 0o700)
    private_state(data)
    service_token = secret_file(data / "service-token")
    admin_token = secret_file(data / "admin-token")

    c.JupyterHub.ip = s.ip
    c.JupyterHub.port = s.port
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = s.hub_port
    c.JupyterHub.db_url = f"sqlite:///{data}/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    # Its token goes to no port another account took (hub_ext/guarded_proxy.py).
    c.JupyterHub.proxy_class = "gpulab.hub_ext.guarded_proxy.GuardedProxy"
    c.ConfigurableHTTPProxy.api_url = f"{s.scheme}://127.0.0.1:{s.proxy_api_port}"
    c.ConfigurableHTTPProxy.command = [find_proxy()]
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")
    proxy_token = secret_file(data / "proxy-token")
    c.ConfigurableHTTPProxy.auth_token = proxy_token

    # Logins (per-user passwords, or --demo's shared one) are set up by
    # auth_config.configure_auth at the end, once servers and services exist.
    c.JupyterHub.api_tokens = {admin_token: ADMIN_USER}

    service_url = f"{s.scheme}://127.0.0.1:{s.service_port}"
    api_url = f"{service_url}/services/{SERVICE_NAME}/api/v1"
    ca_files = configure_tls(c, s)
    c.JupyterHub.spawner_class = "gpulab-local"
    # What the local and the Slurm spawner share (`gpulab slurm-sandbox up --spawner`
    # switches to the latter); the home folders only the local one's.
    c.FractionalHostSpawner.gpulab_api_url = api_url
    c.FractionalHostSpawner.gpulab_public_api_url = f"{s.public_url}/services/{SERVICE_NAME}/api/v1"
    c.FractionalHostSpawner.gpulab_api_token = service_token
    c.FractionalHostSpawner.kernel_dir = str(data / "jupyter")
    c.FractionalLocalSpawner.home_dir_template = str(data / "home" / "{username}")
    c.Spawner.default_url = "/lab"
    c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
    # Servers start slowly on a busy small machine; a dead one is noticed by poll.
    c.Spawner.start_timeout = 180
    c.Spawner.http_timeout = 120

    # The dataset caches' folder on this node: one cache per account under it (one
    # for every server without accounts), read by the service's sampler.
    cache_dir = str(data / "dataset-cache")
    c.FractionalHostSpawner.cache_root = cache_dir
    service_env = {
        **s.to_env(),
        "GPULAB_CACHE_DIR": cache_dir,
        # The service routes endpoint calls from the proxy to its endpoint router.
        "GPULAB_PROXY_API_URL": f"{s.scheme}://127.0.0.1:{s.proxy_api_port}",
        "CONFIGPROXY_AUTH_TOKEN": proxy_token,
        # Hibernation reaches users' servers through the proxy.
        "GPULAB_SERVERS_URL": s.public_url,
    }
    # MLflow's tracking server behind the hub, its store beside gpulab's (where the
    # [mlflow] extra is installed: `make up` installs it); ended jobs are written there
    # as their users' runs.
    with_mlflow = importlib.util.find_spec("mlflow") is not None
    if with_mlflow:
        service_env["GPULAB_MLFLOW_URL"] = f"{s.scheme}://127.0.0.1:{s.mlflow_port}/services/mlflow"
    if ca_files:
        # The hub's internal CAs (to call the hub and the proxy's API) and the public
        # port's CA (hibernation calls servers through it).
        service_env["GPULAB_CA_FILE"] = os.pathsep.join(map(str, ca_files))
    # It imports JupyterHub (the audit hook): only once a hub is configured.
    from .gpulab_hub import add_gpulab_to_hub, add_role, add_service

    add_gpulab_to_hub(
        c,
        service_name=SERVICE_NAME,
        service_url=service_url,
        api_url=api_url,
        service_token=service_token,
        # The hub starts the service (and restarts it). The service samples this
        # machine itself: no node agents, so no agent service.
        # Its Ctrl-C stops the jobs (checkpointed) and replicas too, until the next up.
        service_command=[
            sys.executable,
            "-m",
            "gpulab.service",
            "--GpuLabService.stop_work_on_exit=True",
        ],
        service_environment=service_env,
    )
    if with_mlflow:
        configure_mlflow(c, s, data, service_env, bool(ca_files))
    if s.cull_idle_timeout > 0:
        tls_internal = data / "tls" / "internal"
        add_service(
            c,
            {
                "name": "idle-culler",
                # Ended with the hub: see gpulab.hub_ext.with_the_hub.
                "command": [
                    sys.executable,
                    "-m",
                    "gpulab.hub_ext.with_the_hub",
                    str(os.getpid()),  # this configuration is read by the hub itself
                    sys.executable,
                    "-m",
                    "jupyterhub_idle_culler",
                    f"--timeout={s.cull_idle_timeout}",
                    f"--cull-every={max(5, min(60, s.cull_idle_timeout // 2))}",
                    # The hub's API asks for its internal certificates under internal_ssl.
                    *(
                        ["--ssl-enabled=true", f"--internal-certs-location={tls_internal}"]
                        if s.uses_tls
                        else []
                    ),
                ],
                # How the next `gpulab up` on this data dir knows it for its own.
                "environment": {"GPULAB_DATA_DIR": str(data)},
            },
        )
        add_role(
            c,
            {
                "name": "idle-culler",
                "services": ["idle-culler"],
                "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            },
        )

    from .auth_config import configure_auth  # it imports this module

    configure_auth(c, s)
