"""Slices come back: a failed start and idle culling release them (real hub)."""

import os

import pytest
from hubproc import RunningHub, fresh_user
from support.leftovers import cgroups_of
from support.wait import wait_until

pytestmark = pytest.mark.slow

# Users named "failer" get a server command that exits at once.
CONFIG = """
# The hub notices a dead server only after http_timeout: failer's is short; the others'
# leaves time for a server starting on a busy machine.
def _break_failer(spawner):
    if spawner.user.name == "failer":
        spawner.cmd = ["/bin/false"]
        spawner.http_timeout = 5

c.Spawner.pre_spawn_hook = _break_failer
c.GpuLabService.reconcile_interval = 3
c.Spawner.http_timeout = 30
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("hub"), config=CONFIG, cull_idle_timeout=10)
    yield h
    h.stop()


def wait_for(predicate, timeout=180, what="condition"):
    wait_until(predicate, what, timeout, every=0.5)


def test_failed_start_releases_the_slice(hub):
    hub.hub_api("POST", "/users/failer")
    groups = set(cgroups_of("failer"))  # an earlier run's on this host are not ours
    r = hub.spawn("failer", {"gpu_milli": 500})
    # The hub may answer before the process has died (202) or after (500).
    assert r.status_code in (201, 202, 500), r.text
    hub.wait_server("failer", ready=False)
    wait_for(
        lambda: hub.gpulab("GET", "/allocations", params={"user": "failer"}).json() == [],
        what="failer's slice to be released",
    )

    # It was held (then given back): not a start refused before a slice was placed.
    def trail():  # the hub sends its entries just after it answers
        r = hub.gpulab("GET", "/audit", params={"user": "failer", "limit": 100})
        return [(e["action"], e["result"]) for e in reversed(r.json()["entries"])]

    wait_for(lambda: ("server.start", "failed") in trail(), what="the failed start audited")
    said = trail()
    assert said[-2:] == [("allocation.create", "ok"), ("server.start", "failed")], said
    gpus = hub.gpulab("GET", "/inventory").json()["nodes"][0]["gpus"]
    assert all(g["allocated_milli"] == 0 for g in gpus)
    # Its cgroup went with it (JupyterHub had cleared the spawner's state first).
    assert set(cgroups_of("failer")) <= groups


def test_idle_culling_releases_the_slice(hub):
    hub.hub_api("POST", "/users/sleepy")
    assert hub.spawn("sleepy", {"gpu_milli": 250}).status_code in (201, 202)
    hub.wait_server("sleepy")
    assert len(hub.gpulab("GET", "/allocations", params={"user": "sleepy"}).json()) == 1
    # Nobody touches the server; the culler (10 s timeout) stops it.
    hub.wait_server("sleepy", ready=False, timeout=180)
    wait_for(
        lambda: hub.gpulab("GET", "/allocations", params={"user": "sleepy"}).json() == [],
        what="sleepy's slice to be released",
    )


def test_a_stopped_server_leaves_no_cgroup(hub):
    user = fresh_user("cgroup")
    hub.hub_api("POST", f"/users/{user}")
    groups = set(cgroups_of(user))  # an earlier run's on this host are not ours
    hub.spawn_ready({user: {"gpu_milli": 250}})
    if os.geteuid() == 0:  # accounts and cgroups need root
        assert set(cgroups_of(user)) - groups, "the server runs in no cgroup of its account"
    assert hub.hub_api("DELETE", f"/users/{user}/server").status_code in (202, 204)
    hub.wait_server(user, ready=False)
    assert set(cgroups_of(user)) <= groups


def test_reconcile_releases_slices_of_servers_that_do_not_exist(hub):
    # An allocation for a server the hub has never heard of (as left by a hub
    # that died between allocating and starting): the service gives it back.
    r = hub.gpulab(
        "POST",
        "/allocations",
        json={"user": "ghost", "owner_kind": "server", "owner": "ghost/", "gpu_milli": 500},
    )
    assert r.status_code == 201
    wait_for(
        lambda: hub.gpulab("GET", "/allocations", params={"user": "ghost"}).json() == [],
        timeout=60,
        what="the ghost allocation to be reconciled away",
    )
    assert "Released 1 allocation(s) of server ghost/" in hub.log_tail(200_000)
