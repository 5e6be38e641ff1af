"""The token capture of issue 45, as alice does it: her own server logs the headers
of every call it receives and tries at once what their token can do.

The gpulab service calls users' servers (hibernation: ``POST gpulab/hibernate``;
the idle rule: ``GET api/kernels``). alice owns her server process, so a
``~/.jupyter/jupyter_server_config.py`` in her home sees each call's
``Authorization`` header. It used to be the service's own hub token: with it she
listed every user, read bob's records and ran code in bob's server. Now each call
carries a token of alice's, scoped to her one server, revoked after the call.

A real hub (the session's shared one), real accounts when root, alice's real server.
"""

from __future__ import annotations

import json

import pytest
from hubproc import fresh_user
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE, BOB = fresh_user("alice"), fresh_user("bob")
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep

#: alice's server config: before each call of the service is handled, it logs the
#: header and tries the token against the hub, the gpulab API and bob's server.
HOOK = """
import json, os, urllib.error, urllib.request
from jupyter_server.base.handlers import JupyterHandler

HUB = os.environ["JUPYTERHUB_API_URL"].rstrip("/")
GPULAB = os.environ["GPULAB_API_URL"].rstrip("/")
BOB, BOB_SERVER = {bob!r}, {bob_server!r}
LOG = os.path.expanduser("~/captured.jsonl")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect to a login page is a refusal, not an answer


def ask(url, auth):
    req = urllib.request.Request(url, headers={{"Authorization": auth}})
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as r:
            return [r.status, r.read(65536).decode(errors="replace")]
    except urllib.error.HTTPError as e:
        return [e.code, ""]


_prepare = JupyterHandler.prepare


def prepare(self, *args, **kwargs):
    auth = self.request.headers.get("Authorization", "")
    if auth and ("/gpulab/hibernate" in self.request.path or "/api/kernels" in self.request.path):
        tried = {{
            "whoami": ask(HUB + "/user", auth),
            "list users": ask(HUB + "/users", auth)[0],
            "read bob": ask(HUB + "/users/" + BOB, auth)[0],
            "gpulab jobs": ask(GPULAB + "/jobs", auth)[0],
            "bob's server": ask(BOB_SERVER + "/api/kernels", auth)[0],
        }}
        with open(LOG, "a") as f:
            f.write(json.dumps({{"path": self.request.path, "auth": auth, "tried": tried}}) + "\\n")
    return _prepare(self, *args, **kwargs)


JupyterHandler.prepare = prepare
"""


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def test_what_alice_captures_from_the_service_reaches_her_server_only(hub):
    alice = hub.create_user(ALICE)
    hub.create_user(BOB)  # bob's server is there to be reached for
    hook = HOOK.format(bob=BOB, bob_server=f"{hub.url}/user/{BOB}")
    hub.write_home_file(ALICE, ".jupyter/jupyter_server_config.py", hook)
    hub.spawn_ready({ALICE: {"gpu_milli": 250}, BOB: {"gpu_milli": 0}})

    r = hub.gpulab("POST", "/hibernations", token=alice, json={"server": ""})
    assert r.status_code == 202, r.text
    hid = r.json()["id"]
    row = wait_until(
        lambda: (
            (x := hub.gpulab("GET", f"/hibernations/{hid}", token=alice).json())["state"]
            in ("hibernated", "failed")
            and x
        ),
        f"hibernation {hid} to end",
        WAIT_S,
    )
    assert row["state"] == "hibernated", row.get("error")  # the per-call token reached her server

    log = hub.home(ALICE) / "captured.jsonl"
    captured = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(c["path"].endswith("/gpulab/hibernate") for c in captured), captured
    service_token = (hub.data_dir / "service-token").read_text().strip()
    assert service_token not in log.read_text()
    for call in captured:
        scheme, _, token = call["auth"].partition(" ")
        assert scheme == "token" and token and token != service_token
        tried = call["tried"]
        # While the call was running the token was alive: alice's own, this server only.
        status, body = tried["whoami"]
        assert status == 200, tried
        me = json.loads(body)
        assert (me["kind"], me["name"]) == ("user", ALICE), me
        # (The hub adds reading one's own name and groups to every token's identity.)
        own = {f"read:users:name!user={ALICE}", f"read:users:groups!user={ALICE}"}
        assert set(me["scopes"]) - own == {f"access:servers!server={ALICE}/"}, me
        assert tried["list users"] == 403, tried
        assert tried["read bob"] in (403, 404), tried
        assert tried["gpulab jobs"] in (401, 403), tried
        assert tried["bob's server"] in (302, 403), tried
        # After the call the hub has revoked it: it is nobody's any more.
        gone = hub.hub_api("GET", "/user", token=token)
        assert gone.status_code == 403, gone.text
        assert hub.gpulab("GET", "/jobs", token=token).status_code in (401, 403)


def test_only_the_service_mints_server_tokens_and_revokes_only_its_own(hub):
    """The hub's route (hub_ext/server_tokens.py): neither a user nor the admin may
    mint a token for someone's server; the service mints only for a running server,
    briefly, and cannot revoke a token of the user's own."""
    carol, dave = fresh_user("carol"), fresh_user("dave")
    carol_token = hub.create_user(carol)
    hub.create_user(dave)  # never started
    hub.spawn_ready({carol: {"gpu_milli": 0}})
    service = (hub.data_dir / "service-token").read_text().strip()
    route = "/gpulab/server-tokens"
    body = {"user": carol, "server": ""}

    for who in (carol_token, hub.admin_token):  # the admin role has no such scope
        r = hub.hub_api("POST", route, token=who, json=body)
        assert r.status_code == 403, r.text
    r = hub.hub_api("POST", route, token=service, json={"user": dave, "server": ""})
    assert r.status_code == 404 and "not running" in r.json()["error"]
    deep = "[" * 100_000 + "]" * 100_000
    r = hub.hub_api("POST", route, token=service, data=deep)
    assert r.status_code == 400 and "must be JSON" in r.json()["error"], r.text
    for bad in (0, 301, "60", True):
        r = hub.hub_api("POST", route, token=service, json={**body, "expires_in": bad})
        assert r.status_code == 400 and "expires_in" in r.json()["error"], r.text

    minted = hub.hub_api("POST", route, token=service, json={**body, "expires_in": 30})
    assert minted.status_code == 201, minted.text
    me = hub.hub_api("GET", "/user", token=minted.json()["token"]).json()
    assert me["name"] == carol and f"access:servers!server={carol}/" in me["scopes"]
    # carol's own token is not the service's to revoke; the minted one is.
    own = hub.hub_api("GET", f"/users/{carol}/tokens").json()["api_tokens"]
    own_id = next(t["id"] for t in own if t["id"] != minted.json()["id"])
    assert hub.hub_api("DELETE", f"{route}/{own_id}", token=service).status_code == 404
    # Nor does anyone without the scope learn which ids exist.
    assert hub.hub_api("DELETE", f"{route}/a999999", token=carol_token).status_code == 403
    assert hub.hub_api("GET", "/user", token=carol_token).status_code == 200
    assert hub.hub_api(
        "DELETE", f"{route}/{minted.json()['id']}", token=carol_token
    ).status_code == (403)
    assert hub.hub_api("DELETE", f"{route}/{minted.json()['id']}", token=service).status_code == 204
    assert hub.hub_api("GET", "/user", token=minted.json()["token"]).status_code == 403
