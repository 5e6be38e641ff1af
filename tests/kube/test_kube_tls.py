"""TLS on Kubernetes: the replicas' objects, the service's calls to them, and the chart.

The objects are the real builders' output, validated against the Kubernetes schemas
(``kubernetes-validate --strict``) and cert-manager's (:mod:`cert_manager_schemas`);
the chart is rendered offline (helm-python-sdk, z2jh switched off, its wiring read
from values.yaml). What can run here runs for real: a model server with TLS and the
readiness probe a replica's pod runs against it, the service's sessions to https
replicas (aiohttp, ``GPULAB_CA_FILE``), the replicas' wildcard certificate as the
service's URL names it, and configurable-http-proxy started the way values.yaml's
example starts z2jh's proxy, proxying to an https target. Only the Kubernetes API
server and cert-manager cannot run here; certificates come from
``support.tls_certs`` instead, with the names the chart's Certificates ask for.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import aiohttp
import helm_python as helm
import pytest
import yaml
from cert_manager_schemas import check_cert_manager
from kube_helpers import K8S_VERSIONS, endpoint_unit, validate_strict
from support.plugin_host import kubernetes_serving
from support.tls_certs import issue_cert, make_ca
from support.wait import wait_until
from traitlets.config import Config

from gpulab.backend.kubernetes.deploy import TLS_DIR, TOKEN_ENV, make_deployment
from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.backend.replica_http import ReplicaSessions
from gpulab.client.tls import client_context

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpulab"
NS = "gpulab"
DEP = endpoint_unit(id="0a1b2c3d4e5f", replicas=2)
NAME = "gpulab-ep-d0a1b2c3d4e5f"
ENDPOINT = dict(
    image="registry.example/gpulab:1",
    model_dir="/models/ann/mnist",
    models_pvc="gpulab-models",
    models_root="/models",
    user="ann@example.org",
    replicas=2,
)
TLS_ON = {"jupyterhub": {"enabled": False}, "tls": {"internal": {"enabled": True}}}
TIMEOUT = 60  # seconds: a bound on each call, never a timing claim


# -- the replicas' objects (pure) ------------------------------------------------------
def test_replicas_serve_https_with_the_secret():
    deployment, service = make_deployment(
        "mnist", token_secret="ep-token", tls_secret="gpulab-replicas-tls", port=8080, **ENDPOINT
    )
    for obj in (deployment, service):
        assert validate_strict(obj) == K8S_VERSIONS
    pod = deployment["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"][-4:] == [
        "--ssl-certfile",
        f"{TLS_DIR}/tls.crt",
        "--ssl-keyfile",
        f"{TLS_DIR}/tls.key",
    ]
    assert {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} in c["volumeMounts"]
    assert {
        "name": "tls",
        "secret": {"secretName": "gpulab-replicas-tls", "defaultMode": 0o444},
    } in pod["volumes"]
    assert c["ports"] == [{"name": "https", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/v2/health/live", "port": 8080, "scheme": "HTTPS"}
    # With a token the readiness probe is a command: it dials https on the pod's loopback.
    ready = c["readinessProbe"]["exec"]["command"]
    assert "https://127.0.0.1:8080/v2/health/ready" in ready[-1]
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]


def test_readiness_probe_without_a_token_is_https_too():
    deployment, _ = make_deployment("mnist", tls_secret="gpulab-replicas-tls", **ENDPOINT)
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {
        "path": "/v2/health/ready",
        "port": 8080,
        "scheme": "HTTPS",
    }
    assert validate_strict(deployment) == K8S_VERSIONS


def test_without_tls_the_replicas_stay_plain():
    deployment, service = make_deployment("mnist", token_secret="ep-token", **ENDPOINT)
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--ssl-certfile" not in c["command"]
    assert "scheme" not in c["livenessProbe"]["httpGet"]
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["models"]
    assert service["spec"]["ports"][0]["port"] == 80


def serving(tmp_path, **settings) -> KubernetesServing:
    backend = KubernetesServing(
        str(tmp_path / "deployments"),
        namespace=NS,
        models_pvc="gpulab-models",
        image="registry.example/gpulab:1",
        pod_patch_for=None,
        **settings,
    )
    backend.prepare(DEP["id"])
    return backend


def test_backend_calls_the_replicas_at_an_https_url(tmp_path):
    backend = serving(tmp_path, tls_secret="gpulab-replicas-tls")
    assert backend.url(DEP) == f"https://{NAME}.{NS}.svc:443"
    objects = backend.objects(DEP, [])
    assert [o["kind"] for o in objects] == ["Secret", "NetworkPolicy", "Deployment", "Service"]
    deployment = objects[2]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "tls",
        "secret": {"secretName": "gpulab-replicas-tls", "defaultMode": 0o444},
    } in (volumes)
    for obj in objects:
        assert validate_strict(obj) == K8S_VERSIONS
    backend._ready[DEP["id"]] = 1  # as check() leaves it once a replica is ready
    assert backend.ready_replicas(DEP) == [(0, f"https://{NAME}.{NS}.svc:443")]
    assert serving(tmp_path / "plain").url(DEP) == f"http://{NAME}.{NS}.svc:80"


def test_tls_secret_is_a_setting_of_the_dict_and_of_config(tmp_path):
    settings = {"namespace": NS, "models_pvc": "m", "image": "i", "tls_secret": "rep-tls"}
    assert kubernetes_serving(settings, str(tmp_path)).tls_secret == "rep-tls"
    c = Config()
    c.KubernetesServingSettings.tls_secret = "from-config"
    backend = kubernetes_serving(
        {"namespace": NS, "models_pvc": "m", "image": "i"}, str(tmp_path), config=c
    )
    assert backend.url(DEP).startswith("https://")


async def test_a_relaunch_with_tls_on_moves_a_running_endpoint_to_https(tmp_path):
    """A service restarted with tls_secret set adopts its endpoints again: the Deployment
    is replaced and the kept Service gets the https port (only the Kubernetes API is
    faked: fake_apiserver, real HTTP, the real kubernetes_asyncio client)."""
    from fake_apiserver import FakeApiServer
    from kube_helpers import serving_on

    server = await FakeApiServer().start()
    services = f"/api/v1/namespaces/{NS}/services"
    deployments = f"/apis/apps/v1/namespaces/{NS}/deployments"
    plain = serving_on(server, tmp_path, pod_patch_for=None)
    tls = serving_on(server, tmp_path, pod_patch_for=None, tls_secret="gpulab-replicas-tls")
    try:
        plain.prepare(DEP["id"])
        await plain.launch(DEP, [])
        assert server.get(services, NAME)["spec"]["ports"][0]["port"] == 80
        await tls.adopt(DEP, [])
        service = server.get(services, NAME)
        assert service["spec"]["ports"] == [
            {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
        ]
        assert validate_strict(service) == K8S_VERSIONS
        pod = server.get(deployments, NAME)["spec"]["template"]["spec"]
        assert pod["volumes"][-1]["secret"]["secretName"] == "gpulab-replicas-tls"
        assert tls.url(DEP) == f"https://{NAME}.{NS}.svc:443"
    finally:
        await plain.close()
        await tls.close()
        await server.stop()


# -- what runs for real: a TLS model server, the pod's probe, the service's sessions --
@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    ca = make_ca(root / "ca")
    server = issue_cert(root / "ca", ca)  # 127.0.0.1 and localhost
    # As the chart's Certificates: the service's names, and the replicas' wildcards from
    # a CA of their own.
    service = issue_cert(root / "ca", ca, [f"gpulab.{NS}.svc"], stem="service")
    replicas_ca = make_ca(root / "replicas-ca", "replicas CA")
    replicas = issue_cert(
        root / "replicas-ca", replicas_ca, [f"*.{NS}.svc", f"*.{NS}.svc.cluster.local"]
    )
    return {
        "ca": ca[0],
        "cert": server[0],
        "key": server[1],
        "service": service,
        "replicas_ca": replicas_ca[0],
        "replicas": replicas,
    }


@pytest.fixture(scope="module")
def tls_replica(tmp_path_factory, certs):
    """A model server as a replica runs it with tls_secret and a token."""
    import torch
    from support.model_server import ServerProcess

    from gpulab.serving.export import export_model

    torch.manual_seed(0)
    model_dir = str(tmp_path_factory.mktemp("models") / "tiny")
    export_model(torch.nn.Linear(4, 2).eval(), torch.randn(2, 4), model_dir, name="tiny")
    token = "replica-token"
    os.environ[TOKEN_ENV] = token  # the child reads (and drops) it; ours goes right after
    try:
        server = ServerProcess(
            model_dir, "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key"]
        )
    finally:
        del os.environ[TOKEN_ENV]
    try:
        server.wait_listening()
        yield server, token, model_dir
    finally:
        server.stop()


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.mark.parametrize("token_ok", [True, False], ids=["token", "wrong-token"])
def test_the_pods_readiness_probe_dials_https(tls_replica, token_ok):
    server, token, model_dir = tls_replica
    deployment, _ = make_deployment(
        "tiny",
        **{**ENDPOINT, "model_dir": model_dir, "models_root": str(Path(model_dir).parent)},
        port=port_of(server),
        token_secret="ep-token",
        tls_secret="gpulab-replicas-tls",
    )
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    command = [sys.executable if a == "python" else a for a in probe["exec"]["command"]]
    env = {**os.environ, TOKEN_ENV: token if token_ok else "not-the-token"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if token_ok:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "401" in done.stderr


async def test_service_sessions_trust_gpulab_ca_file(tls_replica, certs, monkeypatch):
    server, token, _ = tls_replica
    url = f"https://localhost:{port_of(server)}"

    def new_session(connector):
        return aiohttp.ClientSession(connector=connector)

    monkeypatch.setenv("GPULAB_CA_FILE", os.pathsep.join([certs["replicas_ca"], certs["ca"]]))
    sessions = ReplicaSessions(new_session)
    try:
        session, base = await sessions.get(url)
        headers = {"Authorization": f"Bearer {token}"}
        async with session.get(f"{base}/v2/health/ready", headers=headers) as answer:
            assert answer.status == 200 and (await answer.json()) == {"ready": True}
    finally:
        await sessions.close()

    monkeypatch.delenv("GPULAB_CA_FILE")
    sessions = ReplicaSessions(new_session)
    try:
        session, base = await sessions.get(url)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with session.get(f"{base}/v2/health/live"):
                pass
    finally:
        await sessions.close()


async def test_a_bad_gpulab_ca_file_says_which(tmp_path, monkeypatch):
    missing = tmp_path / "no-ca.pem"
    monkeypatch.setenv("GPULAB_CA_FILE", str(missing))
    sessions = ReplicaSessions(lambda connector: aiohttp.ClientSession(connector=connector))
    with pytest.raises(OSError, match=f"GPULAB_CA_FILE: cannot read the CA file {missing}"):
        await sessions.get(f"https://{NAME}.{NS}.svc:443")
    await sessions.close()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def https_server(cert: str, key: str):
    """An https server on 127.0.0.1 answering every GET with its path; yields the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def handshake(port: int, name: str, ca_files: str) -> None:
    context = client_context(ca_files.split(os.pathsep))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock,
        context.wrap_socket(sock, server_hostname=name),
    ):
        pass


def test_the_replicas_wildcard_names_every_endpoint_but_is_not_trusted_for_the_service(certs):
    with https_server(*certs["replicas"]) as port:
        # The service (trusting the replicas' CA) reaches any endpoint by its Service name.
        handshake(port, f"{NAME}.{NS}.svc", certs["replicas_ca"])
        handshake(port, f"gpulab-ep-dffff.{NS}.svc.cluster.local", certs["replicas_ca"])
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            handshake(port, f"{NAME}.other-namespace.svc", certs["replicas_ca"])
        # The name matches the gpulab service's too; a caller of the service trusts only
        # the service's CA, so a replica's key cannot pose as the service.
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(port, f"gpulab.{NS}.svc", certs["ca"])
    with https_server(*certs["service"]) as port:
        handshake(port, f"gpulab.{NS}.svc", certs["ca"])


# -- the chart ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(str(CHART)) as c:
        yield c


def render(chart, values, namespace=NS) -> dict[str, dict]:
    out = chart.render(values, name="gpulab", namespace=namespace, is_install=True)
    objects = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def validate_all(objects: dict[str, dict]) -> None:
    for key, obj in objects.items():
        if obj["apiVersion"].startswith("cert-manager.io/"):
            check_cert_manager(obj)
        else:
            assert validate_strict(obj) == K8S_VERSIONS, key


def tls_objects(objects):
    return sorted(k for k, o in objects.items() if o["apiVersion"].startswith("cert-manager.io/"))


def test_internal_tls_from_cert_manager_renders_and_validates(chart):
    objects = render(chart, TLS_ON)
    validate_all(objects)
    assert tls_objects(objects) == [
        "Certificate/gpulab-ca",
        "Certificate/gpulab-replicas",
        "Certificate/gpulab-replicas-ca",
        "Certificate/gpulab-service",
        "Issuer/gpulab-ca",
        "Issuer/gpulab-replicas-ca",
        "Issuer/gpulab-selfsigned",
    ]
    service_cert = objects["Certificate/gpulab-service"]["spec"]
    assert service_cert["secretName"] == "gpulab-service-tls"
    assert service_cert["dnsNames"] == [
        "gpulab",
        "gpulab.gpulab",
        "gpulab.gpulab.svc",
        "gpulab.gpulab.svc.cluster.local",
    ]
    assert service_cert["issuerRef"] == {
        "name": "gpulab-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    replicas = objects["Certificate/gpulab-replicas"]["spec"]
    assert replicas["secretName"] == "gpulab-replicas-tls"
    assert replicas["dnsNames"] == ["*.gpulab.svc", "*.gpulab.svc.cluster.local"]
    # Two CAs: the replicas' certificate does not chain to the one the service's callers trust.
    assert replicas["issuerRef"]["name"] == "gpulab-replicas-ca"
    for ca in ("gpulab-ca", "gpulab-replicas-ca"):
        assert objects[f"Certificate/{ca}"]["spec"]["isCA"] is True
        assert objects[f"Issuer/{ca}"]["spec"] == {"ca": {"secretName": ca}}


def test_service_pod_serves_https_with_its_certificate(chart):
    objects = render(chart, TLS_ON)
    template = objects["Deployment/gpulab"]["spec"]["template"]
    container = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JUPYTERHUB_SERVICE_URL"] == "https://0.0.0.0:10101"
    assert env["JUPYTERHUB_SSL_CERTFILE"] == "/etc/gpulab-tls/tls.crt"
    assert env["JUPYTERHUB_SSL_KEYFILE"] == "/etc/gpulab-tls/tls.key"
    assert env["GPULAB_CA_FILE"].split(os.pathsep) == [
        "/etc/gpulab-tls/ca.crt",
        "/etc/gpulab-replicas-ca/ca.crt",
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/gpulab-tls", "readOnly": True}
    assert volumes["tls"]["secret"] == {"secretName": "gpulab-service-tls", "defaultMode": 0o440}
    # The replicas' CA only, never their key.
    assert volumes["replicas-ca"]["secret"] == {
        "secretName": "gpulab-replicas-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert mounts["replicas-ca"]["mountPath"] == "/etc/gpulab-replicas-ca"
    assert template["spec"]["securityContext"]["fsGroup"] == 1000  # reads the 0440 key
    assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_hub_agents_and_replicas_get_https_urls_and_the_secret(chart):
    objects = render(chart, TLS_ON)
    hub = json.loads(objects["ConfigMap/gpulab-hub-config"]["data"]["hub-values.json"])
    assert hub["serviceUrl"] == "https://gpulab.gpulab.svc:10101"
    assert hub["apiUrl"] == "https://gpulab.gpulab.svc:10101/services/gpulab/api/v1"
    agent = objects["DaemonSet/gpulab-agent"]["spec"]["template"]["spec"]
    assert (
        "--service-url=https://gpulab.gpulab.svc:10101/services/gpulab/api/v1/telemetry"
        in agent["containers"][0]["command"]
    )
    agent_env = {e["name"]: e.get("value") for e in agent["containers"][0]["env"]}
    assert agent_env["GPULAB_CA_FILE"] == "/etc/gpulab-ca/ca.crt"
    assert agent["volumes"] == [
        {
            "name": "gpulab-ca",
            "secret": {
                "secretName": "gpulab-service-tls",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            },
        }
    ]
    service_values = json.loads(objects["ConfigMap/gpulab-service"]["data"]["service-values.json"])
    assert service_values["kubernetesDeployments"]["tlsSecret"] == "gpulab-replicas-tls"


def test_service_config_gives_the_serving_backend_the_replicas_secret(chart, tmp_path, monkeypatch):
    data = yaml.safe_load(render_text(chart, TLS_ON, "configmap-service.yaml"))["data"]
    values = tmp_path / "service-values.json"
    values.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(values))
    c = Config()
    exec(compile(data["gpulab_config.py"], "gpulab_config.py", "exec"), {"get_config": lambda: c})
    settings = c.GpuLabService.kubernetes_deployments
    assert settings["tls_secret"] == "gpulab-replicas-tls"
    backend = kubernetes_serving(settings, str(tmp_path / "deployments"))
    assert backend.url(DEP) == f"https://{NAME}.{NS}.svc:443"


def render_text(chart, values, template: str) -> str:
    out = chart.render(values, name="gpulab", namespace=NS, is_install=True)
    return out[f"gpulab/templates/{template}"]


def test_internal_tls_from_your_issuer(chart):
    values = {
        **TLS_ON,
        "tls": {
            "internal": {
                "enabled": True,
                "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
            }
        },
    }
    objects = render(chart, values)
    validate_all(objects)
    assert tls_objects(objects) == ["Certificate/gpulab-replicas", "Certificate/gpulab-service"]
    for name in ("service", "replicas"):
        assert objects[f"Certificate/gpulab-{name}"]["spec"]["issuerRef"] == {
            "name": "corp-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }


def test_internal_tls_from_your_own_secrets(chart):
    values = {
        **TLS_ON,
        "tls": {
            "internal": {
                "enabled": True,
                "source": "secrets",
                "serviceSecret": "my-service-tls",
                "replicasSecret": "my-replicas-tls",
            }
        },
    }
    objects = render(chart, values)
    validate_all(objects)
    assert tls_objects(objects) == []  # nothing for cert-manager: the Secrets are yours
    template = objects["Deployment/gpulab"]["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in template["volumes"] if "secret" in v}
    assert secrets == {"tls": "my-service-tls", "replicas-ca": "my-replicas-tls"}
    service_values = json.loads(objects["ConfigMap/gpulab-service"]["data"]["service-values.json"])
    assert service_values["kubernetesDeployments"]["tlsSecret"] == "my-replicas-tls"


def test_internal_tls_off_by_default(chart):
    objects = render(chart, {"jupyterhub": {"enabled": False}})
    assert tls_objects(objects) == []
    container = objects["Deployment/gpulab"]["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    assert not names & {"JUPYTERHUB_SSL_CERTFILE", "JUPYTERHUB_SSL_KEYFILE", "GPULAB_CA_FILE"}
    hub = json.loads(objects["ConfigMap/gpulab-hub-config"]["data"]["hub-values.json"])
    assert hub["serviceUrl"].startswith("http://")
    service_values = json.loads(objects["ConfigMap/gpulab-service"]["data"]["service-values.json"])
    assert "tlsSecret" not in service_values["kubernetesDeployments"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"source": "vault"}, "source"),
        ({"serviceSecret": "Not_A_Name"}, "serviceSecret"),
        ({"certManager": {"duration": "90 days"}}, "duration"),
    ],
)
def test_schema_refuses_bad_tls_values(chart, bad, message):
    with pytest.raises(helm.HelmError, match=message):
        chart.validate_schema({**TLS_ON, "tls": {"internal": {"enabled": True, **bad}}})


def test_lint_with_internal_tls():
    for version in K8S_VERSIONS:
        report = helm.lint(str(CHART), TLS_ON, kube_version=f"v{version}.0")
        assert report["errors"] == []
        problems = [m["error"] for m in report["messages"] if m["severity"] >= 2]
        assert problems == []


# -- the z2jh side: values.yaml's commented examples -------------------------------------
def z2jh_examples() -> list[dict]:
    """The YAML examples in the comment of z2jh-values.yaml (the chart's wiring into
    z2jh; lines ``#   ...``), one per block between prose lines."""
    text = (CHART / "z2jh-values.yaml").read_text()
    head = text[text.index("# TLS (docs/howto/kubernetes-tls.md)") : text.index("\nhub:\n")]
    blocks, lines = [], []
    for line in [*head.splitlines(), "# end"]:
        if line.startswith("#  "):
            lines.append(line[1:])
        elif lines:
            blocks.append(yaml.safe_load(textwrap.dedent("\n".join(lines))))
            lines = []
    return blocks


def test_values_show_public_https_through_z2jh():
    proxy, ingress, _ = z2jh_examples()
    https = proxy["proxy"]["https"]
    assert https["enabled"] is True and https["type"] in (
        "letsencrypt",
        "manual",
        "offload",
        "secret",
    )
    assert https["hosts"] and https["letsencrypt"]["contactEmail"]
    ingress = ingress["ingress"]
    assert ingress["enabled"] is True
    assert ingress["tls"][0]["hosts"] == ingress["hosts"]


def test_values_show_every_caller_of_the_service_its_ca():
    *_, callers = z2jh_examples()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    secret = values["tls"]["internal"]["serviceSecret"]
    for part in (callers["hub"], callers["singleuser"]):
        where = part.get("storage", part)
        (volume,) = where["extraVolumes"]
        (mount,) = where["extraVolumeMounts"]
        assert volume["secret"] == {
            "secretName": secret,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }
        assert mount["name"] == volume["name"]
        assert part["extraEnv"]["GPULAB_CA_FILE"] == f"{mount['mountPath']}/ca.crt"
        # The chart's own entries are lists too: the example's add to them.
        z2jh = yaml.safe_load((CHART / "z2jh-values.yaml").read_text())
        assert isinstance(z2jh["hub"]["extraVolumes"], list)
    chp = callers["proxy"]["chp"]
    ref = chp["extraEnv"]["GPULAB_CA_PEM"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret, "key": "ca.crt"}


@pytest.mark.skipif(
    not (ROOT / "node_modules" / ".bin" / "configurable-http-proxy").exists()
    or shutil.which("node") is None,
    reason="configurable-http-proxy (npm) and node are not installed here",
)
@pytest.mark.parametrize("with_ca", [True, False], ids=["ca", "no-ca"])
def test_z2jh_proxy_as_values_yaml_starts_it_reaches_the_https_service(certs, tmp_path, with_ca):
    """configurable-http-proxy started with the example's command, variable and flag
    (the CA file's path moved into the test's folder) proxies /services/gpulab/ to an
    https target with the service's certificate; without the flag it refuses to."""
    *_, callers = z2jh_examples()
    chp = callers["proxy"]["chp"]
    ca_path = str(tmp_path / "gpulab-ca.pem")
    command = [a.replace("/tmp/gpulab-ca.pem", ca_path) for a in chp["command"]]
    flags = [f.replace("/tmp/gpulab-ca.pem", ca_path) for f in chp["extraCommandLineFlags"]]
    port, api_port = free_port(), free_port()
    args = ["--ip=127.0.0.1", f"--port={port}", "--api-ip=127.0.0.1", f"--api-port={api_port}"]
    env = {
        **os.environ,
        "PATH": f"{ROOT / 'node_modules' / '.bin'}{os.pathsep}{os.environ['PATH']}",
        "CONFIGPROXY_AUTH_TOKEN": "proxy-token",
        "GPULAB_CA_PEM": Path(certs["ca"]).read_text(),
    }
    import urllib.error
    import urllib.request

    with https_server(certs["cert"], certs["key"]) as target:
        proc = subprocess.Popen(
            [*command, *args, *(flags if with_ca else [])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            api = f"http://127.0.0.1:{api_port}/api/routes"
            auth = {"Authorization": "token proxy-token"}

            def api_up():
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(api, headers=auth), timeout=5
                    ):
                        return True
                except OSError:
                    return proc.poll() is not None  # exited: stop waiting, report below

            wait_until(api_up, "configurable-http-proxy's API answering", timeout=TIMEOUT)
            assert proc.poll() is None, proc.stdout.read().decode()
            route = urllib.request.Request(
                f"{api}/services/gpulab",
                data=json.dumps({"target": f"https://localhost:{target}"}).encode(),
                headers=auth,
                method="POST",
            )
            urllib.request.urlopen(route, timeout=TIMEOUT).close()
            url = f"http://127.0.0.1:{port}/services/gpulab/api/v1/inventory"
            if with_ca:
                with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
                    assert json.load(answer) == {"path": "/services/gpulab/api/v1/inventory"}
            else:
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(url, timeout=TIMEOUT)
                assert refused.value.code >= 500
            assert Path(ca_path).read_text().strip() == Path(certs["ca"]).read_text().strip()
        finally:
            proc.terminate()
            proc.wait(TIMEOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
