"""kill -9 the gpulab service in the middle of spawns; the hub restarts it.

Allocations made before the crash are intact, none is duplicated, and every
running server holds exactly one allocation, on SQLite and on PostgreSQL.
"""

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from hubproc import RunningHub
from support.wait import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def hub(request, tmp_path):
    db_url = request.getfixturevalue("postgres_db") if request.param == "postgres" else ""
    h = RunningHub(tmp_path / "hub", simulate="2xA100-80GB", db_url=db_url)
    yield h
    h.stop()


def test_kill_service_mid_spawn(hub):
    first = [f"a{i}" for i in range(3)]
    second = [f"b{i}" for i in range(3)]
    for u in first + second:
        hub.hub_api("POST", f"/users/{u}")
    hub.spawn_ready({u: {"gpu_milli": 250} for u in first})
    before = {a["id"]: a for a in hub.gpulab("GET", "/allocations").json()}
    assert len(before) == 3

    pid = hub.service_pid()
    with ThreadPoolExecutor(len(second)) as pool:
        spawns = [pool.submit(hub.spawn, u, {"gpu_milli": 250}) for u in second]
        # Killed once the service has placed a slice of the second batch: mid-spawn.
        wait_until(
            lambda: len(hub.gpulab("GET", "/allocations").json()) > len(before),
            "a spawn of the second batch to reach the service",
            every=0.05,
        )
        os.kill(pid, signal.SIGKILL)
        answers = [f.result() for f in spawns]

    # The hub notices the dead service and starts it again.
    hub.wait_service_restarted(pid)

    for u, r in zip(second, answers, strict=False):
        if r.status_code in (201, 202):
            hub.wait_server(u)
    after = hub.gpulab("GET", "/allocations").json()
    # What was there before the crash is intact.
    for aid, a in before.items():
        assert {**a} in after, f"allocation {aid} lost"
    # One allocation per running server, none duplicated, none leaked.
    running = {
        u
        for u in first + second
        if hub.hub_api("GET", f"/users/{u}").json()["servers"].get("", {}).get("ready")
    }
    owners = [a["owner"] for a in after]
    assert len(owners) == len(set(owners))
    assert set(owners) == {f"{u}/" for u in running}
    assert set(first) <= running
    for u in running:
        env = hub.server_env(u)
        mine = [a for a in after if a["owner"] == f"{u}/"]
        assert env["GPULAB_GPU_UUID"] == mine[0]["gpu_uuid"]
    gpus = hub.gpulab("GET", "/inventory").json()["nodes"][0]["gpus"]
    assert sum(g["allocated_milli"] for g in gpus) == 250 * len(running)
