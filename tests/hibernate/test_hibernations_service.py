"""Hibernation's rules in the real service, in this process, with a fake clock.

What a user's server says (its kernels' activity, what they saved) comes from a
stand-in for the server's two routes (:class:`FakeServer`): these tests are about
the service's decisions (the idle rule, the GPU's activity, a failure that leaves
the server running, who may ask), not the kernels, which ``test_hibernate_hub.py``
runs for real.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from support.clock import fake_clock
from support.service import running_service
from support.wait import wait_until_async

from gpulab.service.hibernation.servers import KernelActivity, ServerRefused

IDLE = "c.Hibernation.hibernate_idle_seconds = 600\n"


class FakeServer:
    """Stands in for users' servers (``GET api/kernels``, ``POST gpulab/hibernate``)."""

    def __init__(self, clock):
        self.clock = clock
        self.idle_s: dict[str, float] = {}  # owner -> seconds since a kernel was active
        self.busy: set[str] = set()
        self.work: dict[str, tuple[str, ...]] = {}  # owner -> work besides its cells
        self.fail_with: str | None = None
        self.saved: list[str] = []

    async def activity(self, user, server):
        owner = f"{user}/{server}"
        if owner not in self.idle_s:
            raise ServerRefused("not running")
        last = self.clock.now() - self.idle_s[owner]
        work = self.work.get(owner, ())
        return KernelActivity(1, int(owner in self.busy), last, work), last - 60

    async def save(self, user, server, hid, max_bytes):
        if self.fail_with:
            raise ServerRefused(self.fail_with)
        self.saved.append(f"{user}/{server}")
        kernel = {"name": "a.ipynb", "notebook": "/home/a.ipynb", "variables": 3}
        kernels = [{**kernel, "saved": 3, "skipped": [], "bytes": 2_500_000}]
        return {"kernels": kernels, "bytes": 2_500_000}


async def start_server(svc, user: str, milli: int = 250) -> str:
    token = svc.create_user(user)
    started = dt.datetime.now(dt.UTC).isoformat()
    svc.fake_hub.users[user]["servers"][""] = {
        "ready": True,
        "url": f"/user/{user}/",
        "started": started,
    }
    body = {"user": user, "owner_kind": "server", "owner": f"{user}/", "gpu_milli": milli}
    r = await svc.request("POST", "/allocations", json=body)
    assert r.status_code == 201, r.text
    return token


def release_on_stop(svc):
    """The spawner's part: a stopped server gives its slice back."""

    def release(owner: str) -> None:
        asyncio.ensure_future(
            svc.request("DELETE", "/allocations", params={"owner_kind": "server", "owner": owner})
        )

    svc.fake_hub.on_stop.append(release)


async def ended(svc, hid: str, token=None) -> dict:
    for _ in range(200):
        row = (await svc.request("GET", f"/hibernations/{hid}", token=token)).json()
        if row["state"] != "saving":
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"hibernation {hid} did not end: {row}")


async def test_the_idle_rule_hibernates_only_idle_servers(tmp_path):
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc", IDLE) as svc:
            release_on_stop(svc)
            fake = svc.app.hibernations.servers = FakeServer(clock)
            # gpu-busy holds a whole GPU: its utilisation is its own.
            await start_server(svc, "gpu-busy", 1000)
            for user in ("idle", "recent", "busy"):
                await start_server(svc, user)
            fake.idle_s = {"idle/": 700, "recent/": 100, "busy/": 700, "gpu-busy/": 700}
            fake.busy = {"busy/"}
            gpu = (await svc.request("GET", "/allocations", params={"user": "gpu-busy"})).json()
            svc.app.telemetry.add(
                {
                    "node": gpu[0]["node"],
                    "ts": clock.now() - 30,
                    "gpus": [{"uuid": gpu[0]["gpu_uuid"], "utilization_ratio": 0.4}],
                }
            )

            started = await svc.app.hibernations.hibernate_idle()
            assert started == ["idle/"]
            (row,) = (await svc.request("GET", "/hibernations", params={"user": "idle"})).json()
            row = await ended(svc, row["id"])
            assert row["state"] == "hibernated", row
            assert row["reason"] == "idle for 12 min" and row["actor"] == "gpulab"
            assert row["summary"].endswith(": 1 kernel, 2.5 MB"), row["summary"]
            assert svc.fake_hub.stopped == ["idle/"]
            held = (await svc.request("GET", "/allocations", params={"user": "idle"})).json()
            assert held == []
            # Nobody else was touched, and nothing is tried twice.
            assert await svc.app.hibernations.hibernate_idle() == []

            async def audited():
                answer = await svc.request("GET", "/audit", params={"action": "server.hibernate"})
                return [(e["subject"], e["result"]) for e in answer.json()["entries"]]

            # Written on the ledger's threads just after the row says hibernated.
            assert await wait_until_async(audited, "the audit entry") == [("idle/", "ok")]


async def test_a_server_at_work_besides_its_cells_is_not_idle(tmp_path):
    """Its kernels are idle, but a thread, a subprocess or a terminal's command runs
    (the server extension's ``gpulab/activity``): neither the idle rule nor the
    scheduler's demand hibernates it."""
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc", IDLE) as svc:
            release_on_stop(svc)
            fake = svc.app.hibernations.servers = FakeServer(clock)
            for user in ("thread", "process", "terminal", "idle"):
                await start_server(svc, user)
                fake.idle_s[f"{user}/"] = 700
            fake.work = {
                "thread/": ("kernel 1a2b3c4d: thread download (fetch)",),
                "process/": ("kernel 1a2b3c4d: process 4242 (python)",),
                "terminal/": ("terminal 1: process 4343 (sleep)",),
            }
            hibernations = svc.app.hibernations
            assert [s.owner for s in await hibernations.idle_servers(60)] == ["idle/"]
            assert await hibernations.hibernate_idle() == ["idle/"]


async def test_a_failed_hibernation_leaves_the_server_running(tmp_path):
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc") as svc:
            fake = svc.app.hibernations.servers = FakeServer(clock)
            fake.fail_with = "OSError: [Errno 28] No space left on device"
            alice = await start_server(svc, "alice")
            r = await svc.request("POST", "/hibernations", token=alice, json={})
            assert r.status_code == 202, r.text
            row = await ended(svc, r.json()["id"], alice)
            assert row["state"] == "failed"
            assert row["error"] == "nothing was stopped: " + fake.fail_with
            assert row["summary"].startswith("hibernation failed: nothing was stopped")
            assert svc.fake_hub.stopped == []
            held = (await svc.request("GET", "/allocations", params={"user": "alice"})).json()
            assert [a["milli"] for a in held] == [250]

            async def audited():
                answer = await svc.request("GET", "/audit", params={"action": "server.hibernate"})
                return [e["result"] for e in answer.json()["entries"]]

            # Written just after the row says failed.
            assert await wait_until_async(audited, "the audit entry") == ["failed"]

            # A server's answer of megabytes (its kernel's exception) is kept short.
            fake.fail_with = "RuntimeError: " + "x" * 4_000_000
            clock.advance(3600)  # past the wait after a failure
            r = await svc.request("POST", "/hibernations", token=alice, json={})
            row = await ended(svc, r.json()["id"], alice)
            assert row["state"] == "failed" and len(row["error"]) == 500, len(row["error"])
            assert row["error"].startswith("nothing was stopped: RuntimeError: xxx")


async def test_who_may_hibernate_and_report_a_wake(tmp_path):
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc") as svc:
            release_on_stop(svc)
            svc.app.hibernations.servers = FakeServer(clock)
            alice = await start_server(svc, "alice")
            bob = svc.create_user("bob")

            # bob has no server; he cannot hibernate alice's or read hers.
            r = await svc.request("POST", "/hibernations", token=bob, json={})
            assert r.status_code == 409 and "not running" in r.json()["error"]
            r = await svc.request("POST", "/hibernations", token=bob, json={"user": "alice"})
            assert r.status_code == 403
            r = await svc.request("POST", "/hibernations", token=alice, json={"kernel": 1})
            assert r.status_code == 400 and "unknown fields: kernel" in r.json()["error"]
            bad = await svc.raw("POST", "/hibernations", alice, b"\xff\xfe{")
            assert bad.status_code == 400

            r = await svc.request("POST", "/hibernations", token=alice, json={})
            hid = r.json()["id"]
            assert (await ended(svc, hid, alice))["state"] == "hibernated"
            assert (await svc.request("GET", f"/hibernations/{hid}", token=bob)).status_code == 404
            listed = await svc.request("GET", "/hibernations", token=bob, params={"user": "alice"})
            assert listed.status_code == 403
            assert (await svc.request("GET", "/hibernations", token=bob)).json() == []

            wake = {"name": "a.ipynb", "restored": ["x", "y"], "failed": [], "seconds": 0.4}
            r = await svc.request("POST", f"/hibernations/{hid}/wakes", token=bob, json=wake)
            assert r.status_code == 404
            for body, why in (
                ({**wake, "name": "other.ipynb"}, "saved no kernel named 'other.ipynb'"),
                ({**wake, "restored": "x"}, "must be lists"),
                ({**wake, "seconds": -1}, "'seconds' must be"),
                ({**wake, "extra": 1}, "unknown fields: extra"),
            ):
                r = await svc.request("POST", f"/hibernations/{hid}/wakes", token=alice, json=body)
                assert r.status_code == 400 and why in r.json()["error"], r.text
            r = await svc.request("POST", f"/hibernations/{hid}/wakes", token=alice, json=wake)
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "woken" and r.json()["wakes"][0]["restored"] == ["x", "y"]
            assert r.json()["summary"].startswith("woken at ")

            # A kernel of thousands of variables is kept as counts and the first names:
            # the row (read by every listing) holds a report per saved kernel.
            names = [f"v{i:05d}" + "x" * 100 for i in range(3000)]
            failed = [{"name": n, "why": "w" * 300} for n in names[:1000]]
            many = {**wake, "restored": names, "failed": failed}
            r = await svc.request("POST", f"/hibernations/{hid}/wakes", token=alice, json=many)
            assert r.status_code == 200, r.text
            (kept,) = (await svc.request("GET", f"/hibernations/{hid}", token=alice)).json()[
                "wakes"
            ]
            assert (kept["restored_count"], kept["failed_count"]) == (3000, 1000)
            assert kept["restored"] == names[:20]
            assert [f["name"] for f in kept["failed"]] == names[:20]
            assert len(json.dumps(kept)) < 20_000


async def test_settings_are_checked(tmp_path):
    from gpulab.service.plugins import ConfigError

    with pytest.raises(ConfigError, match="hibernate_idle_seconds must be 0"):
        async with running_service(tmp_path / "svc", "c.Hibernation.hibernate_idle_seconds = -1\n"):
            pass


async def test_one_hibernation_at_a_time_per_server(tmp_path):
    with fake_clock() as clock:
        async with running_service(tmp_path / "svc") as svc:
            release_on_stop(svc)
            fake = svc.app.hibernations.servers = FakeServer(clock)
            gate = asyncio.Event()
            save = fake.save

            async def slow_save(*args):
                await gate.wait()
                return await save(*args)

            fake.save = slow_save
            alice = await start_server(svc, "alice")
            first, second = await asyncio.gather(
                *(svc.request("POST", "/hibernations", token=alice, json={}) for _ in range(2))
            )
            assert sorted([first.status_code, second.status_code]) == [202, 409]
            refused = first if first.status_code == 409 else second
            assert refused.json()["error"] == "alice's server is already hibernating"
            gate.set()
            accepted = first if first.status_code == 202 else second
            assert (await ended(svc, accepted.json()["id"], alice))["state"] == "hibernated"
