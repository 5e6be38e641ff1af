"""Alerts evaluated by the real service (in-process, a stand-in hub API), with real jobs
(torchrun ranks on CPU), real telemetry pushed the way an agent pushes it, a real
local HTTP server as the webhook receiver, and GET /alerts as each user sees it.

GPU faults cannot happen on this machine (no GPU, no driver): the samples that carry
them are pushed to the service's telemetry route as a node agent would send them.

A stalled job stalls on a fake clock (``support.clock``): it reports once, and the
test advances the ten minutes ``job_stall_seconds`` asks for instead of waiting them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time

import pytest
from support.clock import fake_clock
from support.service import running_service
from support.wait import wait_until_async
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpulab.db.operations import alerts as alerts_table
from gpulab.service.plugins import ConfigError

pytestmark = pytest.mark.asyncio

WAIT_S = 150  # a bound on a loaded 2-core machine, not a sleep
FAST = """
c.Alerting.alert_interval_seconds = 0.3
"""
#: How long a job may send no report() before JobStalled (the default, ten minutes).
STALL_S = 600
#: Ranks run as the service's own account (no per-user Unix accounts in a test's tmp dir).
JOBS = FAST + f"c.Thresholds.job_stall_seconds = {STALL_S}\nc.UserAccounts.enabled = False\n"
STALLS = """
import time
from gpulab.training import report
report(step=1, loss=1.0)
time.sleep(600)
"""
FAILS = """
raise ValueError("bad batch shape on purpose")
"""
SUCCEEDS = """
print("fine")
"""


async def until(check, what: str, timeout: float = WAIT_S, every: float = 0.3):
    """Await ``check()`` (sync or async) until it returns something truthy."""
    return await wait_until_async(check, what, timeout, every)


async def alerts(svc, token=None, **params) -> dict:
    r = await svc.request("GET", "/alerts", token=token, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def named(answer: dict, name: str, subject: str | None = None, state: str | None = None):
    return [
        a
        for a in answer["alerts"]
        if a["name"] == name
        and (subject is None or a["subject"] == subject)
        and (state is None or a["state"] == state)
    ]


def sample(node: str, ts: float, gpus=()) -> dict:
    return {
        "version": 1,
        "ts": ts,
        "node": node,
        "gpus": list(gpus),
        "nics": [],
        "rdma": [],
        "cache": None,
        "missing": {},
    }


async def push(svc, s: dict) -> None:
    r = await svc.request("POST", "/telemetry", json=s)
    assert r.status_code == 201, r.text


async def submit(svc, token, code, name):
    r = await svc.request("POST", "/jobs", token=token, json={"code": code, "name": name})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def clock():
    """gpulab's clock, fake and ticking: the ranks stamp their reports with the real
    clock, which goes on; ``clock.advance`` jumps ahead of it."""
    with fake_clock(ticking=True) as c:
        yield c


@pytest.mark.slow
async def test_stalled_and_failed_jobs_alert_their_owner_and_resolve(tmp_path, clock):
    async with running_service(tmp_path / "svc", JOBS) as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        stalled = await submit(svc, alice, STALLS, "stalls")
        failing = await submit(svc, bob, FAILS, "shape")

        async def reports():
            r = await svc.request("GET", f"/jobs/{stalled['id']}/metrics", token=alice)
            return r.json()["records"]

        async def bob_ended():
            r = await svc.request("GET", f"/jobs/{failing['id']}", token=bob)
            return r.json()["state"] == "failed"

        # bob's job ends before the clock jumps: one still starting then would be
        # stalled too (no report() for ten minutes), a second alert of his.
        await until(bob_ended, "bob's job to fail")
        # alice's job reported once, then went quiet; ten minutes on: JobStalled, for her.
        await until(reports, "the first report() of alice's job")
        assert not named(await alerts(svc, alice), "JobStalled")  # not yet ten minutes
        clock.advance(STALL_S)

        async def alice_stalled():
            return [
                a
                for a in named(await alerts(svc, alice), "JobStalled", stalled["id"], "firing")
                if "has sent no report() since" in a["message"]
            ]

        [alert] = await until(alice_stalled, "JobStalled for alice's job")
        assert "(over 10 min)" in alert["message"]
        assert len(await reports()) == 1  # it did report once: the stall came after
        assert alert["owner"] == "alice" and alert["severity"] == "warning"
        assert alert["subject_kind"] == "job" and alert["resolved_at"] is None
        assert alert["labels"]["job_id"] == stalled["id"]
        assert alert["since"].endswith("Z")

        # bob's job failed: JobFailed, for him, with the job's own message.
        async def bob_failed():
            return named(await alerts(svc, bob), "JobFailed", failing["id"], "firing")

        [failed] = await until(bob_failed, "JobFailed for bob's job")
        assert failed["owner"] == "bob" and "failed at" in failed["message"]
        assert "submit it again" in failed["message"]

        # Each sees only their own; the admin sees both.
        mine = await alerts(svc, bob)
        assert mine["alerts"] and all(a["owner"] == "bob" for a in mine["alerts"])
        assert not named(mine, "JobStalled", stalled["id"])
        theirs = await alerts(svc, alice)
        assert all(a["owner"] == "alice" for a in theirs["alerts"])
        assert not named(theirs, "JobFailed")
        everyone = await alerts(svc)
        assert named(everyone, "JobStalled", stalled["id"], "firing")
        assert named(everyone, "JobFailed", failing["id"], "firing")
        assert everyone["firing"] >= 2 and (await alerts(svc, bob))["firing"] == 1

        # Prometheus reads the same facts: the series the chart's rules use.
        metrics = (await svc.request("GET", "/../../metrics")).text
        assert f'gpulab_job_last_report_timestamp_seconds{{job_id="{stalled["id"]}"}}' in metrics
        assert f'gpulab_job_failed_timestamp_seconds{{job_id="{failing["id"]}"}}' in metrics
        disk = [x for x in metrics.splitlines() if x.startswith("gpulab_disk_free_ratio{")]
        assert any('role="data"' in x and str(svc.data_dir) in x for x in disk), disk

        # The causes go: alice cancels her stuck job, bob submits "shape" again.
        r = await svc.request("DELETE", f"/jobs/{stalled['id']}", token=alice)
        assert r.status_code == 200, r.text
        fixed = await submit(svc, bob, SUCCEEDS, "shape")

        async def resolved(token, name, subject):
            return named(await alerts(svc, token, state="resolved"), name, subject)

        async def stall_resolved():
            gone = await resolved(alice, "JobStalled", stalled["id"])
            return [a for a in gone if a["id"] == alert["id"]]

        [gone] = await until(stall_resolved, "JobStalled resolved")
        assert gone["resolved_at"] >= gone["since"]
        await until(
            lambda: resolved(bob, "JobFailed", failing["id"]),
            f"JobFailed resolved once job {fixed['id']} was submitted",
        )

        async def fixed_ended():
            job = (await svc.request("GET", f"/jobs/{fixed['id']}", token=bob)).json()
            return job["state"] in ("succeeded", "failed") and job["state"]

        assert await until(fixed_ended, "bob's second run to end") == "succeeded"
        assert not (await alerts(svc, alice, state="firing"))["alerts"]
        assert (await alerts(svc, bob))["firing"] == 0


class Receiver:
    """A webhook receiver: answers 503 to its first call (to be retried), then 200."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.calls = 0
        receiver = self

        class Hook(web.RequestHandler):
            def post(self, _secret):
                receiver.calls += 1
                if receiver.calls == 1:
                    self.set_status(503)
                    return
                receiver.bodies.append(json.loads(self.request.body))
                self.write("ok")

        [sock] = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(web.Application([("/hook/([^/]+)", Hook)]))
        self.server.add_sockets([sock])
        self.port = sock.getsockname()[1]


async def test_webhook_gets_alertmanager_json_on_fire_and_resolve(tmp_path, caplog):
    receiver = Receiver()
    secret = "s3cret-token-in-path"
    url = f"http://127.0.0.1:{receiver.port}/hook/{secret}?key={secret}"
    config = FAST + f"c.Alerting.alert_webhook_url = {url!r}\n"
    caplog.set_level(logging.INFO)
    try:
        async with running_service(tmp_path / "svc", config) as svc:
            alice = svc.create_user("alice")
            # Other parts of the service subscribe; one that raises harms no one.
            heard = []

            def broken(event, alert):
                raise RuntimeError("a subscriber's own bug")

            async def listener(event, alert):
                heard.append((event, alert["name"], alert["state"]))

            svc.app.alerts.subscribe(broken)
            svc.app.alerts.subscribe(listener)
            # A node whose latest sample is 5 minutes old: its agent stopped.
            await push(svc, sample("gpu-node-9", time.time() - 300))
            fired = await until(
                lambda: [b for b in receiver.bodies if b["status"] == "firing"],
                "the firing notification",
            )
            body = fired[0]
            assert body["version"] == "4" and body["receiver"] == "gpulab"
            assert body["groupLabels"] == {"alertname": "NodeTelemetryStale"}
            [a] = body["alerts"]
            assert a["status"] == "firing"
            assert a["labels"]["alertname"] == "NodeTelemetryStale"
            assert a["labels"]["severity"] == "warning"
            assert a["labels"]["subject"] == "gpu-node-9"
            assert a["labels"]["hostname"] == "gpu-node-9"
            assert body["commonLabels"] == a["labels"]
            assert "gpu-node-9 sent no telemetry since" in a["annotations"]["summary"]
            assert a["annotations"]["description"]
            assert a["startsAt"].endswith("Z") and a["endsAt"] == "0001-01-01T00:00:00Z"
            assert len(a["fingerprint"]) == 16
            assert body["externalURL"].endswith("/services/gpulab/api/v1/alerts")

            # A shared thing: the admin sees it; alice does not.
            listed = named(await alerts(svc), "NodeTelemetryStale", "gpu-node-9", "firing")
            assert listed and listed[0]["owner"] is None
            assert not (await alerts(svc, alice))["alerts"]

            # The agent is back: the alert resolves, and the receiver hears it.
            await push(svc, sample("gpu-node-9", time.time()))
            resolved = await until(
                lambda: [b for b in receiver.bodies if b["status"] == "resolved"],
                "the resolved notification",
            )
            [r] = resolved[0]["alerts"]
            assert r["fingerprint"] == a["fingerprint"] and r["startsAt"] == a["startsAt"]
            assert r["endsAt"] >= r["startsAt"] and r["endsAt"] != "0001-01-01T00:00:00Z"
            [row] = named(await alerts(svc, state="resolved"), "NodeTelemetryStale")
            assert row["resolved_at"] == r["endsAt"]
            assert receiver.calls == 3  # the first try got 503 and was retried
            assert heard == [
                ("fired", "NodeTelemetryStale", "firing"),
                ("resolved", "NodeTelemetryStale", "resolved"),
            ]
            # Resolved before `since`: not listed.
            later = await alerts(svc, since="2999-01-01T00:00:00+00:00")
            assert later == {"alerts": [], "firing": 0}
    finally:
        receiver.server.stop()
    # The service's own log never shows the URL's secret (the receiver's access log does).
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gpulab"))
    assert "NodeTelemetryStale fired" in ours and "a subscriber's own bug" in caplog.text
    assert secret not in ours


async def test_gpu_faults_fire_for_admins_and_open_alerts_survive_a_restart(tmp_path):
    """XID 79 and a lost GPU in pushed samples (a stand-in for NVML on a GPU node)."""
    uuid = "GPU-9f1c0000-0000-0000-0000-000000000001"
    gpu = {"index": 0, "uuid": uuid, "name": "NVIDIA H200", "xids": [], "lost": False}
    data = tmp_path / "svc"
    async with running_service(data, FAST) as svc:
        alice = svc.create_user("alice")
        now = time.time()
        await push(svc, sample("gpu-node-1", now - 2, [gpu]))
        await push(svc, sample("gpu-node-1", now - 1, [{**gpu, "xids": [79, 13]}]))
        # The XID was in one sample only; the next is clean, and the alert still fires.
        await push(svc, sample("gpu-node-1", now, [gpu]))

        async def xid():
            return named(await alerts(svc), "GpuXidErrors", uuid, "firing")

        [alert] = await until(xid, "GpuXidErrors")
        assert alert["severity"] == "critical" and alert["owner"] is None
        assert "XID 79 (GPU has fallen off the bus)" in alert["message"]
        assert "XID 13" not in alert["message"]  # a program's fault, not the GPU's
        assert alert["labels"] == {"hostname": "gpu-node-1", "gpu": "0", "UUID": uuid}
        assert not (await alerts(svc, alice))["alerts"]

        await push(svc, sample("gpu-node-1", time.time(), [{**gpu, "lost": True}]))
        await until(lambda: _firing(svc, "GpuLost", uuid), "GpuLost")
        await push(svc, sample("gpu-node-1", time.time(), [gpu]))
        await until(lambda: _resolved(svc, "GpuLost", uuid), "GpuLost resolved")
        hub = svc.fake_hub

    # A restart: the XID alert's row is reloaded. Telemetry is memory only, so the
    # XID is unknown to the new service: its first round resolves the alert.
    async with running_service(data, FAST, fake_hub=hub) as svc:
        [row] = await until(lambda: _resolved(svc, "GpuXidErrors", uuid), "resolved at restart")
        assert row["id"] == alert["id"]
        answer = await alerts(svc, state="all")
        assert len(named(answer, "GpuXidErrors")) == 1  # the same episode, not a new row


async def _firing(svc, name, subject):
    return named(await alerts(svc, state="firing"), name, subject)


async def _resolved(svc, name, subject):
    return named(await alerts(svc, state="resolved"), name, subject)


@pytest.mark.parametrize(
    "params, status, message",
    [
        ({"state": "open"}, 400, "'state' must be one of firing, resolved, all, got 'open'"),
        ({"since": "yesterday"}, 400, "'since' must be an ISO 8601 time"),
    ],
)
async def test_bad_alert_queries_say_what_is_wrong(tmp_path, params, status, message):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        r = await svc.request("GET", "/alerts", token=alice, params=params)
        assert r.status_code == status and r.json()["error"].startswith(message), r.text


async def test_alerts_need_a_token(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        r = await svc.request("GET", "/alerts", anonymous=True)
        assert r.status_code in (401, 403)
        assert "error" in r.json()
        r = await svc.request("GET", "/alerts", token="not-a-token")
        assert r.status_code in (401, 403)
        ok = await alerts(svc, svc.create_user("alice"), since="2026-01-01T00:00:00Z")
        assert ok == {"alerts": [], "firing": 0}


async def test_a_zero_interval_stops_the_start_with_the_fix(tmp_path):
    config = "c.Alerting.alert_interval_seconds = 0\n"
    with pytest.raises(ConfigError, match="alert_interval_seconds must be positive, got 0"):
        async with running_service(tmp_path / "svc", config):
            pass


async def test_prometheus_counts_users_near_their_quota_without_naming_them(tmp_path):
    config = FAST + 'c.SharingSettings.user_quota_milli = {"alice": 1000, "bob": 1000}\n'
    async with running_service(tmp_path / "svc", config) as svc:
        svc.create_user("alice")
        svc.create_user("bob")
        for name, model in svc.fake_hub.users.items():  # their servers run
            model["servers"] = {"": {"ready": True}} if name in ("alice", "bob") else {}
        for user, milli in (("alice", 1000), ("bob", 250)):
            body = {"user": user, "owner_kind": "server", "owner": f"{user}/", "gpu_milli": milli}
            r = await svc.request("POST", "/allocations", json=body)
            assert r.status_code == 201, r.text

        async def counted():
            text = (await svc.request("GET", "/../../metrics")).text
            lines = [x for x in text.splitlines() if x.startswith("gpulab_quota_users_near_limit ")]
            return lines if lines and float(lines[0].split()[-1]) == 1.0 else None

        # alice holds all of hers (counted), bob a quarter (not).
        await until(counted, "one user near the quota in the gauge")
        assert 'user="alice"' not in (await svc.request("GET", "/../../metrics")).text


async def test_episodes_resolved_over_30_days_ago_are_pruned(tmp_path):
    data = tmp_path / "svc"
    async with running_service(data, FAST) as svc:
        hub = svc.fake_hub
        engine = svc.app.engine
    now = dt.datetime.now(dt.UTC)

    def episode(subject, resolved_days_ago):
        at = now - dt.timedelta(days=resolved_days_ago)
        return {
            "key": f"DiskNearlyFull|{subject}",
            "name": "DiskNearlyFull",
            "severity": "warning",
            "subject_kind": "disk",
            "subject": subject,
            "owner": None,
            "message": f"{subject} was full",
            "labels": "{}",
            "since": at - dt.timedelta(hours=1),
            "resolved_at": at,
            "updated": at,
        }

    with engine.begin() as c:
        c.execute(alerts_table.insert(), [episode("/old", 40), episode("/recent", 10)])
    async with running_service(data, FAST, fake_hub=hub) as svc:

        async def kept():
            answer = await alerts(svc, since="2000-01-01T00:00:00Z")
            subjects = {a["subject"] for a in answer["alerts"]}
            return subjects if "/old" not in subjects else None

        assert await until(kept, "the 40-day-old episode pruned") == {"/recent"}
