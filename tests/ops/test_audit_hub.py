"""The audit trail on a real hub (`gpulab up`): logins, server starts and stops by a
user and by an admin for them, the spawner's allocations, a job, admin actions on
users and groups: each exactly once, with the right actor; users read only their
own; and a kill -9 of the service loses no entry, neither one the service had
answered nor one the hub sent while it was down.

The hub is this module's own: the kill -9 would disturb the shared one.
"""

from __future__ import annotations

import collections
import json
import os
import signal

import pytest
from hubproc import RunningHub
from logins import log_in, sign_up_approved
from support.wait import wait_until

pytestmark = pytest.mark.slow

PASSWORD = "audit-pass-9417"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("audit-hub"), simulate="2xA100-80GB")
    yield h
    h.stop()


def audit(hub, token=None, **params) -> list[dict]:
    r = hub.gpulab("GET", "/audit", token=token, params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def counted(rows) -> collections.Counter:
    return collections.Counter(
        (e["action"], e["actor"], e["actor_kind"], e["user"], e["result"]) for e in rows
    )


def wait_entries(hub, want: collections.Counter, **params) -> collections.Counter:
    """Until the trail holds at least what is wanted (the hub sends its entries just
    after it answers); then what it holds."""

    def enough():
        got = counted(audit(hub, **params))
        return got if all(got[k] >= n for k, n in want.items()) else None

    return wait_until(
        enough, f"audit entries {dict(want)}", detail=lambda: json.dumps(audit(hub, **params))
    )


def test_hub_events_are_recorded_once_with_their_actor(hub):
    # A name of its own: Unix accounts (gpulab-<name>) are machine-wide.
    name = f"audit{os.getpid()}"
    other = f"audit{os.getpid()}b"  # whose server an admin starts and stops
    sign_up_approved(hub, name, PASSWORD)  # signs up; the admin logs in and approves
    assert log_in(hub, name, PASSWORD).cookies  # the user logs in
    log_in(hub, name, "wrong-password-1")  # and fails once
    r = hub.hub_api("POST", f"/users/{name}/tokens", json={"note": "audit test"})
    token = r.json()["token"]

    # The user starts and stops their server; an admin does it for another user.
    assert hub.spawn(name, {"gpu_milli": 250}, token=token).status_code in (201, 202)
    hub.wait_server(name)
    assert hub.hub_api("DELETE", f"/users/{name}/server", token=token).status_code in (202, 204)
    hub.wait_server(name, ready=False)
    assert hub.hub_api("POST", f"/users/{other}").status_code == 201
    assert hub.spawn(other, {"gpu_milli": 250}).status_code in (201, 202)
    hub.wait_server(other)
    assert hub.hub_api("DELETE", f"/users/{other}/server").status_code in (202, 204)
    hub.wait_server(other, ready=False)
    # The user may not start the admin's server (the hub answers 404): denied.
    assert hub.spawn("admin", {}, token=token).status_code == 404

    # A job: the user submits, the admin cancels it.
    r = hub.gpulab(
        "POST", "/jobs", token=token, json={"code": "import time; time.sleep(60)", "name": "a"}
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert hub.gpulab("DELETE", f"/jobs/{job}").status_code == 200

    # The admin changes users and groups. A name of its own: deleting a user retires
    # their Unix account, which is machine-wide (another module's "dave" would lose it).
    newcomer = f"audit{os.getpid()}c"
    assert hub.hub_api("POST", f"/users/{newcomer}").status_code == 201
    assert hub.hub_api("PATCH", f"/users/{newcomer}", json={"admin": True}).status_code == 200
    assert hub.hub_api("POST", "/groups/lab").status_code == 201
    r = hub.hub_api("POST", "/groups/lab/users", json={"users": [newcomer]})
    assert r.status_code == 200
    r = hub.hub_api("PUT", "/groups/lab/properties", json={"gpulab_quota_milli": 2000})
    assert r.status_code == 200
    assert hub.hub_api("DELETE", f"/users/{newcomer}").status_code == 204

    c = (name, "user")
    a = ("admin", "admin")
    svc = ("gpulab", "service")
    want = collections.Counter(
        {
            ("user.signup", *c, name, "ok"): 1,
            ("user.authorize", *a, name, "ok"): 1,
            ("login", *c, name, "ok"): 1,
            ("login", *c, name, "denied"): 1,
            ("token.create", *a, name, "ok"): 1,
            ("server.start", *c, name, "ok"): 1,
            ("server.stop", *c, name, "ok"): 1,
            ("allocation.create", *svc, name, "ok"): 1,
            ("allocation.release", *svc, name, "ok"): 1,
            ("server.start", *c, "admin", "denied"): 1,
            ("job.submit", *c, name, "ok"): 1,
            ("job.cancel", *a, name, "ok"): 1,
        }
    )
    got = wait_entries(hub, want)
    # What the user did or was done to them: exactly these, each once.
    theirs = collections.Counter({k: n for k, n in got.items() if name in (k[1], k[3])})
    assert theirs == want, json.dumps(audit(hub, user=name))
    # An admin starting and stopping another user's server: the admin is the actor.
    for_other = collections.Counter(
        {
            ("user.create", *a, other, "ok"): 1,
            ("server.start", *a, other, "ok"): 1,
            ("server.stop", *a, other, "ok"): 1,
            ("allocation.create", *svc, other, "ok"): 1,
            ("allocation.release", *svc, other, "ok"): 1,
        }
    )
    assert counted(audit(hub, user=other)) == for_other
    admin = collections.Counter(
        {
            ("user.create", *a, newcomer, "ok"): 1,
            ("user.admin", *a, newcomer, "ok"): 1,
            ("group.create", *a, None, "ok"): 1,
            ("group.change", *a, None, "ok"): 2,
            ("user.delete", *a, newcomer, "ok"): 1,
        }
    )
    got = wait_entries(hub, admin, actor="admin")
    assert {k: got[k] for k in admin} == admin
    # The admin's own login (to approve the user) is there too.
    assert got[("login", *a, "admin", "ok")] >= 1

    rows = audit(hub, user=name)
    [start] = audit(hub, user=other, action="server.start")
    assert start["subject"] == f"{other}/" and start["detail"] == {"gpu_milli": 250}
    assert all(e["source"] == "127.0.0.1" for e in rows)
    props = next(e for e in audit(hub, action="group.change") if "properties" in e["detail"])
    assert props["subject"] == "lab" and props["detail"]["properties"] == {
        "gpulab_quota_milli": 2000
    }
    assert token not in json.dumps(audit(hub)) and PASSWORD not in json.dumps(audit(hub))

    # The user reads their own entries only, even when she asks for someone else's.
    mine = audit(hub, token)
    assert mine and all(name in (e["user"], e["actor"]) for e in mine)
    assert len(mine) == sum(want.values())
    assert hub.gpulab("GET", "/audit", token=token, params={"user": "admin"}).status_code == 403
    # The export parses, one entry a line.
    r = hub.gpulab("GET", "/audit", token=token, params={"format": "jsonl"})
    assert [json.loads(x)["id"] for x in r.text.splitlines()] == [e["id"] for e in mine]


def test_a_start_from_the_spawn_form_is_one_entry(hub):
    """The form's POST starts the server; the pages it redirects to (spawn-pending,
    the server) and the form itself are not starts."""
    name = f"audit{os.getpid()}f"
    sign_up_approved(hub, name, PASSWORD)
    s = log_in(hub, name, PASSWORD)
    form = s.get(f"{hub.url}/hub/spawn", timeout=60)
    assert form.status_code == 200 and 'name="gpu_milli"' in form.text
    xsrf = s.cookies.get("_xsrf", path="/hub/")  # the form's POST is checked against it
    r = s.post(f"{hub.url}/hub/spawn", data={"_xsrf": xsrf, "gpu_milli": "0"}, timeout=120)
    assert r.status_code == 200, r.text[-500:]
    hub.wait_server(name)
    s.get(f"{hub.url}/hub/spawn", timeout=60)  # running: redirects to the server
    r = hub.hub_api("DELETE", f"/users/{name}/server")
    assert r.status_code in (202, 204)
    hub.wait_server(name, ready=False)

    def both():
        rows = audit(hub, user=name, action="server.*")
        return rows if len(rows) >= 2 else None

    rows = wait_until(both, f"{name}'s start and stop")
    assert [(e["action"], e["actor"], e["actor_kind"]) for e in rows] == [
        ("server.stop", "admin", "admin"),
        ("server.start", name, "user"),
    ]
    assert rows[1]["detail"] == {"gpu_milli": 0}


def test_entries_survive_a_kill_9_of_the_service(hub):
    body = {"user": "erin", "owner_kind": "job", "owner": "kill-test/0", "gpu_milli": 250}
    assert hub.gpulab("POST", "/allocations", json=body).status_code == 201
    pid = hub.service_pid()
    os.kill(pid, signal.SIGKILL)  # right after the answer
    # While the service is down, the admin acts at the hub: the hub keeps the entry.
    assert hub.hub_api("POST", "/groups/after-kill").status_code == 201
    hub.wait_service_restarted(pid)

    made = audit(hub, action="allocation.create", subject="kill-test/0")
    assert [(e["actor"], e["user"], e["result"]) for e in made] == [("admin", "erin", "ok")]
    wait_until(
        lambda: audit(hub, action="group.create", subject="after-kill"),
        "the hub's entry from while the service was down",
    )
    assert len(audit(hub, action="group.create", subject="after-kill")) == 1
    hub.gpulab("DELETE", "/allocations", params={"owner_kind": "job", "owner": "kill-test/0"})
