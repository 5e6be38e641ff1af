"""Spawning through the JupyterHub REST API against a real hub (2 simulated A100s)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from hubproc import fresh_user
from support.group_limits import limited_user
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE, BOB, CAPPED = fresh_user("alice"), fresh_user("bob"), fresh_user("capped")


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub (empty when this module starts; its servers stopped
    at its end)."""
    return plain_hub


@pytest.fixture(scope="module")
def capped(hub):
    """A user whose quota (a hub group's, this module's own) is a quarter GPU: the group."""
    hub.hub_api("POST", f"/users/{CAPPED}")
    with limited_user(hub, CAPPED, quota_milli=250) as group:
        yield group


def stop_all(hub, users):
    for u in users:
        hub.hub_api("DELETE", f"/users/{u}/server")
    for u in users:
        hub.wait_server(u, ready=False)


def test_twenty_concurrent_quarter_spawns_place_exactly_eight(hub):
    users = [f"c{i:02d}" for i in range(20)]
    for u in users:
        hub.hub_api("POST", f"/users/{u}")
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda u: hub.spawn(u, {"gpu_milli": 250}), users))
    codes = [r.status_code for r in answers]
    refused = [r for r in answers if r.status_code >= 400]
    assert len(refused) == 12, codes
    for r in refused:
        # Fails fast with a message that says why and what to do.
        assert r.status_code == 409
        assert "no GPU has room for 1/4 GPU" in r.json()["message"]
    started = [u for u, r in zip(users, answers, strict=False) if r.status_code in (201, 202)]
    assert len(started) == 8
    for u in started:
        hub.wait_server(u)
    inventory = hub.gpulab("GET", "/inventory").json()
    gpus = inventory["nodes"][0]["gpus"]
    assert [g["allocated_milli"] for g in gpus] == [1000, 1000]
    allocations = hub.gpulab("GET", "/allocations").json()
    assert sorted(a["owner"] for a in allocations) == sorted(f"{u}/" for u in started)
    # Each server's environment names the GPU the ledger gave it.
    by_owner = {a["owner"]: a for a in allocations}
    for u in started:
        env = hub.server_env(u)
        assert env["GPULAB_GPU_MILLI"] == "250"
        assert env["GPULAB_GPU_UUID"] == by_owner[f"{u}/"]["gpu_uuid"]
        assert env["CUDA_VISIBLE_DEVICES"] == env["GPULAB_GPU_UUID"]
        assert env["GPULAB_API_URL"] == hub.api
    # Refused users hold nothing and have no server.
    for u in set(users) - set(started):
        assert not hub.hub_api("GET", f"/users/{u}").json()["servers"]
    stop_all(hub, started)
    assert hub.gpulab("GET", "/allocations").json() == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gpu_milli": 300}, "3/10 GPU is not a slice size offered here"),
        ({"gpu_milli": "a lot"}, "must be an integer"),
        ({"gpu_milli": -250}, "cannot be negative"),
        ({"gpus": 1}, "unknown option gpus"),
        ({"gpu_milli": 1500}, "not a whole number of GPUs"),
    ],
)
def test_bad_user_options_are_400_and_change_nothing(hub, options, message):
    hub.hub_api("POST", "/users/badinput")
    before = hub.gpulab("GET", "/allocations").json()
    r = hub.spawn("badinput", options)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert not hub.hub_api("GET", "/users/badinput").json()["servers"]
    assert hub.gpulab("GET", "/allocations").json() == before


def test_quota_exceeded_is_refused_with_the_reason(hub, capped):
    r = hub.spawn(CAPPED, {"gpu_milli": 500})
    assert r.status_code == 403
    assert f"over the quota of group {capped!r}" in r.json()["message"]
    assert not hub.hub_api("GET", f"/users/{CAPPED}").json()["servers"]
    assert hub.gpulab("GET", "/allocations", params={"user": CAPPED}).json() == []


def test_group_quota_from_hub_group_properties(hub):
    g1, g2, lab = fresh_user("g1"), fresh_user("g2"), fresh_user("lab")
    for u in (g1, g2):
        hub.hub_api("POST", f"/users/{u}")
    r = hub.hub_api("POST", f"/groups/{lab}", json={"users": [g1, g2]})
    assert r.status_code == 201, r.text
    try:
        r = hub.hub_api("PUT", f"/groups/{lab}/properties", json={"gpulab_quota_milli": 250})
        assert r.status_code == 200, r.text
        # The service caches group lookups briefly; the availability route shows the quota.
        avail = wait_until(
            lambda: (
                (a := hub.gpulab("GET", "/availability", params={"user": g2}).json())["quota_milli"]
                == 250
                and a
            ),
            f"the group quota to show for {g2}",
            30,
        )
        assert avail["quota_milli"] == 250
        assert hub.spawn(g1, {"gpu_milli": 250}).status_code in (201, 202)
        hub.wait_server(g1)
        r = hub.spawn(g2, {"gpu_milli": 100})
        assert r.status_code == 403 and f"group {lab!r}" in r.json()["message"]
        stop_all(hub, [g1])
    finally:
        # The group is this test's: no later test on the shared hub sees it.
        hub.hub_api("DELETE", f"/groups/{lab}")


def test_no_gpu_server_holds_nothing(hub):
    hub.hub_api("POST", "/users/cpuonly")
    assert hub.spawn("cpuonly", {"gpu_milli": 0}).status_code in (201, 202)
    hub.wait_server("cpuonly")
    env = hub.server_env("cpuonly")
    assert env["GPULAB_GPU_MILLI"] == "0" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert hub.gpulab("GET", "/allocations", params={"user": "cpuonly"}).json() == []
    stop_all(hub, ["cpuonly"])


def test_users_see_and_release_only_their_own(hub):
    alice = hub.create_user(ALICE)
    bob = hub.create_user(BOB)
    hub.spawn_ready({ALICE: {"gpu_milli": 100}, BOB: {"gpu_milli": 100}})
    mine = hub.gpulab("GET", "/allocations", token=alice).json()
    assert [a["user"] for a in mine] == [ALICE]
    assert hub.gpulab("GET", "/allocations", token=alice, params={"user": BOB}).status_code == 403
    bobs = hub.gpulab("GET", "/allocations", token=bob).json()[0]
    # Another user's allocation is invisible: 404, and it stays.
    assert hub.gpulab("GET", f"/allocations/{bobs['id']}", token=alice).status_code == 404
    assert hub.gpulab("DELETE", f"/allocations/{bobs['id']}", token=alice).status_code == 404
    r = hub.gpulab(
        "DELETE", "/allocations", token=alice, params={"owner_kind": "server", "owner": f"{BOB}/"}
    )
    assert r.status_code == 404
    assert hub.gpulab("GET", f"/allocations/{bobs['id']}", token=bob).status_code == 200
    assert hub.gpulab("GET", "/availability", token=alice, params={"user": BOB}).status_code == 403
    # Users cannot allocate directly.
    r = hub.gpulab(
        "POST",
        "/allocations",
        token=alice,
        json={"user": ALICE, "owner_kind": "job", "owner": "x", "gpu_milli": 100},
    )
    assert r.status_code == 403
    # The admin sees everyone's and may release bob's: told that his server holds it,
    # and with force=1 the server is stopped first.
    everyone = {a["user"] for a in hub.gpulab("GET", "/allocations").json()}
    assert {ALICE, BOB} <= everyone
    r = hub.gpulab("DELETE", f"/allocations/{bobs['id']}")
    assert r.status_code == 409 and "?force=1" in r.json()["error"]
    r = hub.gpulab("DELETE", f"/allocations/{bobs['id']}", params={"force": "1"})
    assert r.status_code == 200 and r.json()["released"][0]["id"] == bobs["id"]
    stop_all(hub, [ALICE, BOB])


def test_unauthenticated_and_malformed_requests(hub):
    import requests

    r = requests.get(f"{hub.api}/allocations", timeout=30)
    assert r.status_code == 401 and "authentication required" in r.json()["error"]
    r = requests.get(
        f"{hub.api}/inventory", headers={"Authorization": "token nonsense"}, timeout=30
    )
    assert r.status_code == 401
    r = hub.gpulab("POST", "/allocations", data=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = hub.gpulab(
        "POST",
        "/allocations",
        json={"user": "x", "owner_kind": "server", "owner": "x/", "gpu_milli": 7},
    )
    assert r.status_code == 400 and "is not a slice size offered here" in r.json()["error"]
    r = hub.gpulab(
        "POST",
        "/allocations",
        json={"user": "x", "owner_kind": "boat", "owner": "x/", "gpu_milli": 250},
    )
    assert r.status_code == 400
    r = hub.gpulab("DELETE", "/allocations")
    assert r.status_code == 400
    doc = hub.gpulab("GET", "/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/api/v1/allocations" in doc["paths"]
    metrics = requests.get(
        f"{hub.url}/services/gpulab/metrics", headers=hub.auth(), timeout=30
    ).text
    assert "gpulab_gpu_allocated_ratio" in metrics
    assert requests.get(f"{hub.url}/services/gpulab/metrics", timeout=30).status_code == 401
