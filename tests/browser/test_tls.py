"""`gpulab up --tls self-signed` end to end: a real hub whose every hop is TLS.

A real Chromium that trusts the hub's CA (imported into its NSS certificate store,
as a user imports it) signs up, logs in, spawns and runs a cell whose gpulab client
calls the service over https; the hub reports every server and service at an https
URL, and so does the proxy's routing table; tritonclient calls an endpoint over
https with the CA; plain http on the public port does not serve the hub, and a
client without the CA is refused.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as httpclient
from hubproc import RunningHub, fresh_user, let_accounts_reach
from lab_pages import click_launcher_card, watch_failed_requests
from logins import browser_log_in, toggle_approval
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect
from support.chromium import CHROMIUM_ARGS
from support.wait import wait_until
from tritonclient.utils import InferenceServerException

from gpulab.client import Client, Endpoint
from gpulab.enforcement.accounts import unix_name
from gpulab.serving.export import export_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PASSWORD = "a long password of her own"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("tls-hub"), tls=True)
    if h.accounts:
        let_accounts_reach(h.data_dir)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def trusting_browser(playwright_sync, hub, tmp_path_factory):
    """Chromium whose certificate store (NSS, in $HOME/.pki/nssdb) trusts the hub's CA."""
    home = tmp_path_factory.mktemp("browser-home")
    nssdb = home / ".pki" / "nssdb"
    nssdb.mkdir(parents=True)
    subprocess.run(["certutil", "-d", f"sql:{nssdb}", "-N", "--empty-password"], check=True)
    subprocess.run(
        ["certutil", "-d", f"sql:{nssdb}", "-A", "-t", "C,,", "-n", "gpulab CA", "-i", hub.ca],
        check=True,
    )
    b = playwright_sync.chromium.launch(
        executable_path="/usr/bin/chromium",
        args=CHROMIUM_ARGS,
        env={**os.environ, "HOME": str(home)},
    )
    yield b
    b.close()


@pytest.fixture(scope="module")
def playwright_sync():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def test_plain_http_on_the_public_port_does_not_serve_the_hub(hub):
    assert hub.url.startswith("https://")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{hub.port}/hub/login", timeout=10)
    # A client that does not trust gpulab's CA is refused, not served.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{hub.url}/hub/login", timeout=10)
    assert requests.get(f"{hub.url}/hub/login", timeout=10, verify=hub.verify).status_code == 200
    # Keys stay the hub's: nothing in the TLS folder another account may read but the CA.
    for path in (hub.data_dir / "tls").rglob("*.key"):
        assert not path.stat().st_mode & 0o077, path
    assert not (hub.data_dir / "tls" / "ca-key.pem").stat().st_mode & 0o077
    assert (hub.data_dir / "tls" / "ca.pem").stat().st_mode & 0o004  # users' kernels read it


def test_a_browser_trusting_the_ca_signs_up_spawns_and_runs_a_cell(
    trusting_browser, playwright_sync, hub, artifacts_dir
):
    user = fresh_user("tls")
    page = trusting_browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    failed = watch_failed_requests(page)
    page.goto(f"{hub.url}/hub/signup")
    page.fill("#username_input", user)
    page.fill("#password_input", PASSWORD)
    page.fill("#password_confirmation_input", PASSWORD)
    page.click("#signup_submit")
    expect(page.locator("body")).to_contain_text("sent to the admin")
    toggle_approval(hub, user)

    browser_log_in(page, hub, user, PASSWORD)
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    assert page.url.startswith("https://")
    page.check("#gpulab-slice-250")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(rf".*/user/{re.escape(user)}/lab.*"), timeout=240_000)
    click_launcher_card(page, "Python 3 (gpulab)", failed)
    expect(page.get_by_text("| Idle")).to_be_visible(timeout=120_000)
    cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    # The kernel's client calls the service at the public https URL, trusting the CA
    # the spawner named in GPULAB_CA_FILE.
    page.keyboard.type(
        "import os; from gpulab.client import Client; "
        'print(os.environ["GPULAB_API_URL"].split(":")[0], '
        '[a["milli"] for a in Client().allocations()])'
    )
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-OutputArea-output").first).to_contain_text("https [250]")
    page.screenshot(path=os.path.join(artifacts_dir, "tls-lab-cell.png"))
    page.close()

    # The server's own certificate (internal_ssl) is its account's alone to read.
    folder = hub.data_dir / "tls" / "servers" / user / "default"
    keys = list(folder.glob("*.key"))
    assert keys, f"no key handed to {user}'s server in {folder}"
    st = keys[0].stat()
    assert stat.S_IMODE(st.st_mode) == 0o400
    if hub.accounts:
        assert st.st_uid == pwd.getpwnam(unix_name(user)).pw_uid

    # A browser that does not trust the CA is stopped at the certificate.
    plain = playwright_sync.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
    try:
        with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
            plain.new_page().goto(f"{hub.url}/hub/login")
    finally:
        plain.close()


def _internal_routes(hub) -> dict:
    """The proxy's whole routing table, from its API: https, and it asks the caller for
    a certificate of the hub's CAs (the hub's own, read here as root)."""
    internal = hub.data_dir / "tls" / "internal"
    ports = json.loads((hub.data_dir / "ports.json").read_text())
    token = (hub.data_dir / "proxy-token").read_text().strip()
    r = requests.get(
        f"https://127.0.0.1:{ports['proxy_api_port']}/api/routes",
        headers={"Authorization": f"token {token}"},
        cert=(
            str(internal / "hub-internal" / "hub-internal.crt"),
            str(internal / "hub-internal" / "hub-internal.key"),
        ),
        verify=str(internal / "hub-ca_trust.crt"),
        timeout=30,
    )
    r.raise_for_status()
    return r.json()


def test_every_url_the_hub_reports_is_https(hub):
    user = fresh_user("tls")
    hub.create_user(user)
    assert hub.spawn(user, {"gpu_milli": 100}).status_code in (201, 202)
    hub.wait_server(user)
    services = hub.hub_api("GET", "/services").json()
    assert services["gpulab"]["url"].startswith("https://127.0.0.1:")
    routes = _internal_routes(hub)
    targets = {spec: route["target"] for spec, route in routes.items()}
    # The hub itself, the gpulab service, the endpoint router, the user's server.
    for spec in ("/", "/services/gpulab", f"/user/{user}", "/services/gpulab/endpoints"):
        found = [t for s, t in targets.items() if s.rstrip("/") == spec.rstrip("/")]
        assert found, f"no route {spec} in {targets}"
    assert all(t.startswith("https://") for t in targets.values()), targets
    # Each answers TLS with a certificate from the hub's internal CAs (verified), to
    # the hub's own certificate.
    internal = hub.data_dir / "tls" / "internal"
    trust = str(internal / "hub-ca_trust.crt")
    hub_cert = (
        str(internal / "hub-internal" / "hub-internal.crt"),
        str(internal / "hub-internal" / "hub-internal.key"),
    )
    for target in targets.values():
        requests.get(target, verify=trust, cert=hub_cert, timeout=30)
    # A user's server asks every caller for a certificate of the hub or the proxy:
    # none, or another server's (what a user's own code could read), is refused.
    server = next(t for s, t in targets.items() if s.rstrip("/") == f"/user/{user}")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server, verify=trust, timeout=30)
    folder = hub.data_dir / "tls" / "servers" / user / "default"
    own = (str(folder / f"user-{user}.crt"), str(folder / f"user-{user}.key"))
    assert os.path.exists(own[0]) and os.path.exists(own[1])
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server, verify=trust, cert=own, timeout=30)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    path = tmp_path_factory.mktemp("tls-model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="tiny", max_batch_size=8)
    return str(path), model


def test_tritonclient_and_endpoint_call_over_https_with_the_ca(hub, tiny_model):
    path, model = tiny_model
    user = fresh_user("tls")
    token = hub.create_user(user)
    client = Client(hub.api, token=token, ca_file=str(hub.ca))
    client.create_deployment(path, {"name": "tiny", "gpu_milli": 250, "max_batch_size": 8})
    wait_until(
        lambda: client.get_deployment("tiny")["state"] == "running",
        "the endpoint over https to run",
        240,
        0.5,
        detail=hub.log_tail,
    )
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()

    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    where = f"127.0.0.1:{hub.port}/services/gpulab/endpoints/{user}/tiny"
    triton = httpclient.InferenceServerClient(
        where, ssl=True, ssl_options={"ca_certs": str(hub.ca)}
    )
    answer = triton.infer("tiny", [inp], headers={"Authorization": f"token {token}"})
    np.testing.assert_allclose(answer.as_numpy("output"), expected, rtol=1e-5, atol=1e-6)

    out = Endpoint("tiny", client=client).infer(x)
    np.testing.assert_allclose(out["output"], expected, rtol=1e-5, atol=1e-6)

    # Without the CA, tritonclient does not talk to the hub at all.
    blind = httpclient.InferenceServerClient(where, ssl=True)
    with pytest.raises((InferenceServerException, OSError)) as refused:
        blind.infer("tiny", [inp], headers={"Authorization": f"token {token}"})
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value) or "certificate" in str(refused.value)
    client.stop_deployment("tiny")


def test_hibernation_reaches_a_server_over_https_with_a_token_of_its_own(hub):
    """The service's call into a user's server goes through the https public port with
    a token the hub mints for it over internal TLS: the server hibernates, and the
    hub's log shows the token minted and revoked, never the service's token used."""
    name = fresh_user("tls-hibernate")
    token = hub.create_user(name)
    hub.spawn_ready({name: {"gpu_milli": 0}})
    r = hub.gpulab("POST", "/hibernations", token=token, json={"server": ""})
    assert r.status_code == 202, r.text
    hid = r.json()["id"]
    row = wait_until(
        lambda: (
            (x := hub.gpulab("GET", f"/hibernations/{hid}", token=token).json())["state"]
            in ("hibernated", "failed")
            and x
        ),
        f"hibernation {hid} to end",
        240,
    )
    assert row["state"] == "hibernated", row.get("error")
    log = hub.log_tail(200_000)
    assert "201 POST /hub/api/gpulab/server-tokens" in log
    assert "204 DELETE /hub/api/gpulab/server-tokens/" in log
    assert f"POST /user/{name}/gpulab/hibernate ({name}@" in log  # as the user, not gpulab
