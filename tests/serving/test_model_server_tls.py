"""The model server over TLS (``--ssl-certfile``/``--ssl-keyfile``), called by a real
OIP v2 client (tritonclient.http) that trusts a test CA, and refused without it."""

import os
import socket
import ssl
import subprocess
import sys

import gevent.ssl
import numpy as np
import pytest
import requests
import tritonclient.http as triton
from support.tls_certs import issue_cert, make_ca

from gpulab.serving.tls import tls_context

TIMEOUT = 60  # seconds; a bound on every call, never a wait


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and localhost, and one of another CA."""
    root = tmp_path_factory.mktemp("tls")
    ca = make_ca(root / "ca")
    cert, key = issue_cert(root / "server", ca)
    stranger = make_ca(root / "stranger")
    return {"ca": ca[0], "cert": cert, "key": key, "stranger_ca": stranger[0]}


@pytest.fixture(scope="module")
def tls_server(model_dirs, certs):
    from support.model_server import ServerProcess

    server = ServerProcess(
        model_dirs["tiny"], "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key"]
    )
    try:
        server.wait_listening()
        yield server
    finally:
        server.stop()


def https_client(host_port: str, **tls) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(
        host_port, ssl=True, connection_timeout=TIMEOUT, network_timeout=TIMEOUT, **tls
    )


def infer_tiny(client, x):
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("tiny", [inp]).as_numpy("output")


def reference(model, x):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def test_plain_http_to_the_tls_port_gets_no_answer(tls_server):
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{tls_server.url}/v2/health/ready", timeout=TIMEOUT)


@pytest.mark.parametrize(
    "trust",
    [
        pytest.param(lambda ca: {"ssl_options": {"ca_certs": ca}}, id="ssl_options-ca_certs"),
        pytest.param(
            lambda ca: {
                "ssl_context_factory": lambda **kw: gevent.ssl.create_default_context(cafile=ca)
            },
            id="ssl_context_factory",
        ),
    ],
)
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tritonclient_infers_over_https_with_the_ca(tls_server, certs, tiny_model, trust, host):
    port = tls_server.url.rsplit(":", 1)[1]
    client = https_client(f"{host}:{port}", **trust(certs["ca"]))
    try:
        assert client.is_server_ready() and client.is_model_ready("tiny")
        x = np.random.default_rng(3).standard_normal((2, 16), dtype=np.float32)
        np.testing.assert_allclose(
            infer_tiny(client, x), reference(tiny_model, x), rtol=1e-5, atol=1e-6
        )
    finally:
        client.close()


@pytest.mark.parametrize("ca", ["system", "stranger_ca"])
def test_a_client_without_the_ca_is_refused(tls_server, certs, ca):
    # "system": tritonclient's default trust (certifi's public CAs); "stranger_ca": another CA.
    tls = {} if ca == "system" else {"ssl_options": {"ca_certs": certs[ca]}}
    client = https_client(tls_server.url, **tls)
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            client.is_server_ready()
    finally:
        client.close()
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://{tls_server.url}/v2/health/live", timeout=TIMEOUT)


def test_requests_with_the_ca_reach_the_server(tls_server, certs):
    answer = requests.get(
        f"https://{tls_server.url}/v2/health/live", verify=certs["ca"], timeout=TIMEOUT
    )
    assert answer.json() == {"live": True}


def test_one_flag_without_the_other_stops_the_server(model_dirs, certs):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulab.serving.server",
            "--model-dir",
            model_dirs["tiny"],
            "--port",
            "0",
            "--ssl-certfile",
            certs["cert"],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "--ssl-certfile needs --ssl-keyfile too" in done.stderr
    assert "listening" not in done.stdout


def test_tls_context_errors_name_the_file_and_the_fix(tmp_path, certs):
    assert tls_context(None, None) is None
    with pytest.raises(ValueError, match="--ssl-keyfile needs --ssl-certfile too"):
        tls_context(None, certs["key"])
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=f"--ssl-certfile {missing}: cannot read it"):
        tls_context(missing, certs["key"])
    if os.geteuid() != 0:  # root reads any file: the mode test means nothing then
        locked = tmp_path / "locked-key.pem"
        locked.write_bytes(open(certs["key"], "rb").read())
        locked.chmod(0)
        with pytest.raises(ValueError, match="--ssl-keyfile .*: cannot read it: Permission"):
            tls_context(certs["cert"], str(locked))
    # A key of another certificate: caught at start, not at the first handshake.
    other_cert, other_key = issue_cert(tmp_path, make_ca(tmp_path), ["other"])
    with pytest.raises(ValueError, match="matching private key"):
        tls_context(certs["cert"], other_key)
    assert isinstance(tls_context(certs["cert"], certs["key"]), ssl.SSLContext)


def mount_secret(folder, cert: str, key: str, version: int) -> None:
    """Put ``cert``/``key`` in ``folder`` as the kubelet updates a Secret volume: the
    files are links through ``..data``, a link swapped in one rename to a new folder."""
    data = folder / f"..{version}"
    data.mkdir()
    (data / "tls.crt").write_bytes(open(cert, "rb").read())
    (data / "tls.key").write_bytes(open(key, "rb").read())
    swap = folder / "..data_tmp"
    swap.symlink_to(data.name)
    os.replace(swap, folder / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")


def served_serial(host_port: str, ca: str) -> int:
    from cryptography import x509

    host, port = host_port.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca)
    with (
        socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_a_renewed_certificate_is_served_without_a_restart(model_dirs, certs, tmp_path):
    from cryptography import x509
    from support.model_server import ServerProcess
    from support.wait import wait_until

    secret = tmp_path / "secret"
    secret.mkdir()
    mount_secret(secret, certs["cert"], certs["key"], 1)
    server = ServerProcess(
        model_dirs["tiny"],
        "--ssl-certfile",
        str(secret / "tls.crt"),
        "--ssl-keyfile",
        str(secret / "tls.key"),
        "--ssl-reload-seconds",
        "0.2",
    )
    try:
        server.wait_listening()
        first = x509.load_pem_x509_certificate(open(certs["cert"], "rb").read()).serial_number
        assert served_serial(server.url, certs["ca"]) == first
        ca = (certs["ca"], certs["ca"].replace("ca.pem", "ca-key.pem"))
        renewed = issue_cert(tmp_path / "renewed", ca)
        mount_secret(secret, *renewed, 2)
        second = x509.load_pem_x509_certificate(open(renewed[0], "rb").read()).serial_number
        wait_until(
            lambda: served_serial(server.url, certs["ca"]) == second,
            "the renewed certificate served",
            timeout=TIMEOUT,
        )
        assert server.alive()  # the same process: no restart
    finally:
        server.stop()
