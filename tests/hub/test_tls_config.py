"""`gpulab up --tls self-signed` and `--ssl-cert F --ssl-key F`, read without a hub: the
options refused with their fix, the CA kept across restarts, and the hub configured for
https outside and internal_ssl inside (tests/browser/test_tls.py runs it for real)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from support.tls_certs import issue_cert, make_ca
from traitlets.config import Config

from gpulab.client.tls import client_context
from gpulab.hub_ext import tls
from gpulab.hub_ext.hub_config import Settings, configure

GPULAB = str(Path(sys.executable).with_name("gpulab"))


def up(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GPULAB, "up", "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ssl-cert", "x.pem"], "--ssl-cert needs --ssl-key too"),
        (["--ssl-key", "x.pem"], "--ssl-key needs --ssl-cert too"),
        (["--tls", "self-signed", "--ssl-cert", "a", "--ssl-key", "b"], "give one or the other"),
        (["--ssl-cert", "/nonexistent.pem", "--ssl-key", "/nonexistent.key"], "no such file"),
    ],
)
def test_tls_options_that_cannot_run_are_refused_with_the_fix(tmp_path, args, said):
    r = up(tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert said in r.stderr
    assert r.stderr.startswith("gpulab up: ")


def test_a_certificate_with_the_wrong_key_is_refused(tmp_path):
    ca = make_ca(tmp_path / "ca")
    cert, _ = issue_cert(tmp_path / "one", ca)
    _, other_key = issue_cert(tmp_path / "two", ca)
    r = up(tmp_path, "--ssl-cert", cert, "--ssl-key", other_key)
    assert r.returncode == 2
    assert "not a PEM certificate and its key" in r.stderr


def test_tls_other_than_self_signed_is_refused(tmp_path):
    r = up(tmp_path, "--tls", "letsencrypt")
    assert r.returncode == 2 and "self-signed" in r.stderr


def test_the_ca_is_made_once_and_kept_and_names_this_machine(tmp_path):
    names = tls.machine_names("10.1.2.3")
    assert {"localhost", "127.0.0.1", "10.1.2.3"} <= set(names)
    first = tls.self_signed(tmp_path, names)
    assert first.ca == tmp_path / "tls" / "ca.pem"
    assert os.stat(tmp_path / "tls").st_mode & 0o777 == 0o711
    assert os.stat(first.ca).st_mode & 0o777 == 0o644  # users' kernels read it
    assert os.stat(tmp_path / "tls" / "ca-key.pem").st_mode & 0o777 == 0o600
    assert os.stat(first.key).st_mode & 0o777 == 0o600
    ca_pem, cert_pem = first.ca.read_bytes(), first.cert.read_bytes()

    # A restart keeps the CA (browsers trust it) and the certificate (still good).
    again = tls.self_signed(tmp_path, names)
    assert again.ca.read_bytes() == ca_pem and again.cert.read_bytes() == cert_pem
    # A new address gets a new certificate from the same CA.
    moved = tls.self_signed(tmp_path, [*names, "10.9.9.9"])
    assert moved.ca.read_bytes() == ca_pem and moved.cert.read_bytes() != cert_pem
    cert = x509.load_pem_x509_certificate(moved.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.9.9.9" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}

    # What a client that trusts only ca.pem accepts: the certificate, for 127.0.0.1.
    context = ssl.create_default_context(cafile=str(moved.ca))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(moved.cert, moved.key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve():
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls_conn:
                tls_conn.recv(1)

        t = threading.Thread(target=serve)
        t.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            assert conn.version().startswith("TLS")
            conn.send(b"x")
        t.join()


def configured(tmp_path, **tls_options) -> Config:
    c = Config()
    umask = os.umask(0o022)
    saved = os.environ.get("GPULAB_CA_FILE")
    try:
        configure(c, Settings(data_dir=tmp_path / "data", **tls_options))
        hub_trusts = os.environ.get("GPULAB_CA_FILE")
    finally:
        os.umask(umask)
        if saved is None:
            os.environ.pop("GPULAB_CA_FILE", None)
        else:
            os.environ["GPULAB_CA_FILE"] = saved
    c.hub_trusts = hub_trusts
    return c


def test_self_signed_makes_every_url_https_and_turns_internal_ssl_on(tmp_path):
    c = configured(tmp_path, tls="self-signed")
    data = tmp_path / "data"
    assert c.JupyterHub.ssl_cert == str(data / "tls" / "hub.pem")
    assert c.JupyterHub.ssl_key == str(data / "tls" / "hub-key.pem")
    assert c.JupyterHub.internal_ssl is True
    assert c.JupyterHub.internal_certs_location == str(data / "tls" / "internal")
    assert c.ConfigurableHTTPProxy.api_url.startswith("https://127.0.0.1:")
    gpulab = next(s for s in c.JupyterHub.services if s["name"] == "gpulab")
    assert gpulab["url"].startswith("https://127.0.0.1:")
    env = gpulab["environment"]
    assert env["GPULAB_SERVERS_URL"].startswith("https://")
    assert env["GPULAB_PROXY_API_URL"].startswith("https://")
    # The service trusts the public CA and the hub's internal ones; servers the public one.
    assert env["GPULAB_CA_FILE"].split(os.pathsep) == [
        str(data / "tls" / "ca.pem"),
        str(data / "tls" / "internal" / "hub-ca_trust.crt"),
    ]
    assert c.hub_trusts == env["GPULAB_CA_FILE"]
    assert c.FractionalHostSpawner.gpulab_ca_file == str(data / "tls" / "ca.pem")
    assert c.FractionalHostSpawner.gpulab_public_api_url.startswith("https://127.0.0.1:")
    assert c.FractionalHostSpawner.gpulab_api_url.startswith("https://127.0.0.1:")
    culler = next(s for s in c.JupyterHub.services if s["name"] == "idle-culler")
    assert "--ssl-enabled=true" in culler["command"]


def test_an_operators_certificate_is_served_and_no_ca_is_handed_out(tmp_path):
    ca = make_ca(tmp_path / "ca")
    cert, key = issue_cert(tmp_path / "site", ca)
    c = configured(tmp_path, ssl_cert=cert, ssl_key=key)
    assert (c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key) == (cert, key)
    # Servers pass through tls/ to read their certificates (the hub's umask is 077).
    assert os.stat(tmp_path / "data" / "tls").st_mode & 0o777 == 0o711
    assert c.JupyterHub.internal_ssl is True
    # Clients trust a site's certificate the way they trust any site's.
    assert "gpulab_ca_file" not in c.FractionalHostSpawner
    gpulab = next(s for s in c.JupyterHub.services if s["name"] == "gpulab")
    assert gpulab["environment"]["GPULAB_CA_FILE"] == str(
        tmp_path / "data" / "tls" / "internal" / "hub-ca_trust.crt"
    )


def test_without_tls_nothing_changes(tmp_path):
    c = configured(tmp_path)
    assert "ssl_cert" not in c.JupyterHub and "internal_ssl" not in c.JupyterHub
    gpulab = next(s for s in c.JupyterHub.services if s["name"] == "gpulab")
    assert gpulab["url"].startswith("http://") and "GPULAB_CA_FILE" not in gpulab["environment"]


def test_an_unreadable_ca_file_says_which_and_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_CA_FILE", str(tmp_path / "gone.pem"))
    with pytest.raises(OSError, match=r"cannot read the CA file .*gone\.pem.*unset GPULAB_CA_FILE"):
        client_context()
