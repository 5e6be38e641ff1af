"""Sign-up, Discard, deleting a user and failed logins on a real hub, as an attacker
and an admin would try them (issue 24's High and Medium findings):

- a sign-up under an existing hub user's name was accepted and looked ordinary
  on /hub/authorize;
- Discard on such a sign-up deleted the hub user, whose server ran on as an
  orphan with its slice released (the GPU then given twice);
- deleting a user left their training jobs running;
- 11 wrong admin passwords locked the admin out.
"""

import json
import pwd
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from cells import SLEEPS
from hubproc import fresh_user, replica_pids
from logins import XSRF, admin_password, log_in, page_link, sign_up, sign_up_approved
from requests.adapters import HTTPAdapter
from support.wait import wait_until

from gpulab.client import Client
from gpulab.enforcement.accounts import unix_name
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow

PASSWORD = "a long password of theirs"


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


@pytest.fixture(scope="module")
def admin(hub):
    s = log_in(hub, "admin", admin_password(hub))
    assert logged_in(s)
    return s


def logged_in(session: requests.Session) -> bool:
    return any(c.name.startswith("jupyterhub-hub-login") for c in session.cookies)


def authorize_page(hub, admin) -> str:
    r = admin.get(f"{hub.url}/hub/authorize", timeout=30)
    r.raise_for_status()
    return r.text


def test_a_sign_up_under_an_existing_hub_users_name_is_refused(hub, admin):
    existing = fresh_user("made-by-admin")
    hub.create_user(existing)  # the admin page's "Add users"
    for name in (existing, existing.upper()):
        r = sign_up(hub, name, PASSWORD)
        assert r.status_code == 409, (r.status_code, r.text[-500:])
        assert f"The name {existing} is already in use" in r.text
    assert f'id="{existing}"' not in authorize_page(hub, admin)


def test_hub_pages_are_gpulabs_and_say_what_the_users_servers_hold(hub, admin):
    login = requests.get(f"{hub.url}/hub/login", timeout=30)
    assert login.status_code == 200 and 'class="gpulab-mark"' in login.text
    assert "nav-link gpulab-holds" not in login.text  # nobody is logged in
    page = authorize_page(hub, admin)
    assert 'class="gpulab-mark"' in page and "Change password" in page  # the native links
    assert "Has 2FA?" not in page  # 2FA is off: no column saying False for everyone
    name = fresh_user("holds")
    sign_up_approved(hub, name, PASSWORD)
    user = log_in(hub, name, PASSWORD)
    home = user.get(f"{hub.url}/hub/home", timeout=30).text
    assert 'class="gpulab-mark"' in home and "nav-link gpulab-holds" not in home  # no server yet
    assert hub.spawn(name, {"gpu_milli": 250}).status_code in (201, 202)
    hub.wait_server(name)
    for path in ("/hub/home", "/hub/token"):
        text = user.get(f"{hub.url}{path}", timeout=30).text
        held = re.search(r'class="nav-link gpulab-holds"[^>]*>(.*?)</a>', text, re.S)
        assert held and held.group(1).split("</i>")[1].strip() == "1/4 GPU", path
    hub.hub_api("DELETE", f"/users/{name}/server")
    hub.wait_server(name, ready=False)


def test_discard_drops_the_sign_up_only_and_the_user_keeps_their_server(hub, admin):
    # A sign-up waits; then the admin makes a hub user of that name, who starts a
    # server with a slice (the order that still lets the two meet).
    name = fresh_user("signed-up")
    assert "sent to the admin" in sign_up(hub, name, PASSWORD).text
    hub.create_user(name)
    assert hub.spawn(name, {"gpu_milli": 250}).status_code in (201, 202)
    hub.wait_server(name)
    page = authorize_page(hub, admin)
    row = page[page.index(f'id="{name}"') :].split("</tr>", 1)[0]
    assert "existing-hub-user" in row and "server running" in row

    r = admin.get(hub.url + page_link(page, "discard", name), allow_redirects=False, timeout=30)
    assert r.status_code == 302, (r.status_code, r.text[-500:])

    assert f'id="{name}"' not in authorize_page(hub, admin)  # the sign-up is gone
    user = hub.hub_api("GET", f"/users/{name}")
    assert user.status_code == 200, "Discard deleted the hub user"
    assert user.json()["servers"][""]["ready"]
    held = [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == name]
    assert [(a["owner_kind"], a["milli"]) for a in held] == [("server", 250)]
    hub.hub_api("DELETE", f"/users/{name}/server")
    hub.wait_server(name, ready=False)


def test_deleting_a_user_stops_their_jobs_and_endpoints_first(hub, admin, tmp_path):
    name = fresh_user("leaving")
    token = hub.create_user(name)
    job = hub.gpulab("POST", "/jobs", token=token, json={"code": SLEEPS, "gpu_milli": 250})
    assert job.status_code in (200, 201), job.text
    job_id = job.json()["id"]
    # A nightly job: left behind, it would run on, and a later user given the name
    # would inherit it (the notebook in its job, the runs' output).
    nightly = {"name": "nightly", "schedule": "0 3 * * *", "job": {"code": "print(1)"}}
    sched = hub.gpulab("POST", "/schedules", token=token, json=nightly)
    assert sched.status_code == 201, sched.text
    # A training file of the fine-tuning API: kept by the name, a later user given it
    # listed it and read its content.
    gateway = hub.api.removesuffix("/api/v1") + "/v1"
    chat = [{"role": "user", "content": "pw?"}, {"role": "assistant", "content": "swordfish"}]
    training = json.dumps({"messages": chat}).encode() + b"\n"
    upload = requests.post(
        f"{gateway}/files",
        headers=hub.auth(token),
        files={"file": ("t.jsonl", training)},
        data={"purpose": "fine-tune"},
        timeout=60,
        verify=hub.verify,
    )
    assert upload.status_code == 200, upload.text
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    export_model(model.eval(), torch.randn(2, 4), str(tmp_path), name="m", max_batch_size=4)
    dep = Client(hub.api, token=token).create_deployment(
        str(tmp_path), {"name": "leaving-endpoint", "gpu_milli": 100}
    )
    wait_until(
        lambda: (
            hub.gpulab("GET", f"/jobs/{job_id}").json()["state"] == "running"
            and replica_pids(hub, dep["id"])
        ),
        f"{name}'s job and endpoint running",
        detail=hub.log_tail,
    )
    # The admin page lists them under the servers' slices (asked of the service).
    held = admin.get(f"{hub.url}/hub/gpulab/held/all", timeout=30)
    assert held.status_code == 200, held.text
    items = held.json()["items"]
    mine = [(i["kind"], i["name"], i["size"]) for i in items if i["user"] == name]
    assert sorted(mine) == [
        ("endpoint", "leaving-endpoint", "1/10 GPU"),
        ("job", "train", "1/4 GPU"),
    ]
    # A user may not read everyone's.
    other = fresh_user("curious")
    sign_up_approved(hub, other, PASSWORD)
    r = log_in(hub, other, PASSWORD).get(f"{hub.url}/hub/gpulab/held/all", timeout=30)
    assert r.status_code == 403

    r = hub.hub_api("DELETE", f"/users/{name}")
    assert r.status_code == 204, r.text

    assert hub.hub_api("GET", f"/users/{name}").status_code == 404
    assert hub.gpulab("GET", f"/jobs/{job_id}").json()["state"] == "cancelled"
    assert hub.gpulab("GET", "/deployments", params={"user": name}).json() == []
    assert hub.gpulab("GET", "/schedules", params={"user": name}).json() == []
    files = requests.get(
        f"{gateway}/files", headers=hub.auth(), params={"user": name}, timeout=60, verify=hub.verify
    )
    assert files.status_code == 200 and files.json()["data"] == [], files.text
    assert replica_pids(hub, dep["id"]) == []
    assert not [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == name]

    # Their Unix account goes to no one: a new user approved under the name later
    # does not get the old one's home, files and processes (per-user accounts: root).
    if not hub.accounts:
        return
    account = unix_name(name)
    try:
        assert pwd.getpwnam(account).pw_gecos.startswith("gpulab retired "), account
        hub.create_user(name)
        r = hub.spawn(name, {"gpu_milli": 0})
        assert r.status_code >= 400, r.text
        assert f"the Unix account {account} belonged to an earlier hub user" in r.text, r.text
    finally:
        hub.hub_api("DELETE", f"/users/{name}")
        # What an admin does before giving the name to someone else; a later run of
        # this suite on the same machine uses the name again.
        subprocess.run(["userdel", "-r", account], capture_output=True)


def test_a_user_whose_server_is_still_starting_is_not_deleted(hub):
    """JupyterHub stops only a ready server before deleting its user; one still
    starting would run on, and its slice with it."""
    name = fresh_user("starting")
    hub.create_user(name)
    # The hub answers a spawn once the server is up (or after 10 s): ask in the
    # background and delete while it starts.
    with ThreadPoolExecutor(1) as pool:
        spawned = pool.submit(hub.spawn, name, {"gpu_milli": 250})

        def state():
            server = (hub.hub_api("GET", f"/users/{name}").json().get("servers") or {}).get("")
            return server and (server["pending"] or ("ready" if server["ready"] else None))

        if wait_until(state, f"{name}'s server starting") != "spawn":
            pytest.skip("the server was ready before the deletion could be tried")
        r = hub.hub_api("DELETE", f"/users/{name}")
        assert spawned.result().status_code in (201, 202)
    assert r.status_code == 409, r.text
    assert f"{name}'s server (default) is starting or running" in r.json()["message"]
    hub.wait_server(name)  # still theirs, and it starts
    assert hub.hub_api("DELETE", f"/users/{name}").status_code == 204
    assert not [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == name]
    subprocess.run(["userdel", "-r", unix_name(name)], capture_output=True)  # retired


class FromAddress(HTTPAdapter):
    """Connections from another loopback address: another client, as the proxy sees it."""

    def __init__(self, address: str):
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def log_in_from(hub, address: str, name: str, password: str, s=None):
    """Log in through the proxy from ``address`` (in session ``s``: a browser that
    has logged in before keeps its cookies)."""
    if s is None:
        s = requests.Session()
        s.mount("http://", FromAddress(address))
    xsrf = XSRF.search(s.get(f"{hub.url}/hub/login", timeout=30).text).group(1)
    r = s.post(
        f"{hub.url}/hub/login",
        data={"_xsrf": xsrf, "username": name, "password": password},
        timeout=30,
    )
    return s, r


def test_wrong_passwords_lock_the_attacker_not_the_user_even_on_one_machine(hub):
    """Every process of this machine reaches the proxy over loopback, from whatever
    127/8 address it picks: one source. The user's browser, which logged in before
    (the admin on her laptop), is not held up by a kernel guessing her password.
    (A fresh user, not the admin: the shared hub's admin logs in for other tests.)"""
    victim, attacker = fresh_user("victim"), "127.0.0.2"
    sign_up_approved(hub, victim, PASSWORD)
    browser, _ = log_in_from(hub, "127.0.0.1", victim, PASSWORD)
    assert logged_in(browser)
    browser.get(f"{hub.url}/hub/logout", timeout=30)
    assert not logged_in(browser)
    for i in range(11):
        s, r = log_in_from(hub, attacker, victim, f"wrong guess {i}")
        assert r.status_code == 403 and not logged_in(s)
    # Her browser gets in at once.
    log_in_from(hub, "127.0.0.1", victim, PASSWORD, browser)
    assert logged_in(browser)
    # The attacker waits, even with the right password and from another loopback
    # address, and is told so.
    for address in (attacker, "127.0.0.3"):
        s, r = log_in_from(hub, address, victim, PASSWORD)
        assert not logged_in(s)
        assert "Too many failed logins from your address" in r.text
