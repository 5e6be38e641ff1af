"""Alerts can be acknowledged by their owner and admins, and resolve when their cause
goes: on the real service (in-process, a stand-in hub API) with real failing jobs
(torchrun ranks on CPU), through ``POST /alerts/{id}/ack``, the client and
``%gpulab alerts --ack``.

A failed job's ``JobFailed`` is about an event: acknowledging it resolves it, and it
does not fire again though the job stays failed; submitting the job (its name) again
resolves it too. An alert about a condition (a GPU's XID errors) stays firing until its
cause goes, but no longer counts as firing once acknowledged.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from support.service import running_service
from support.wait import wait_until_async

from gpulab.client import Client
from gpulab.db.operations import alerts as alerts_table

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

WAIT_S = 150  # a bound on a loaded 2-core machine, not a sleep
#: Ranks run as the service's own account (no per-user Unix accounts in a tmp dir).
CONFIG = "c.Alerting.alert_interval_seconds = 0.3\nc.UserAccounts.enabled = False\n"
FAILS = 'raise ValueError("bad batch shape on purpose")\n'


async def alerts(svc, token=None, **params) -> dict:
    r = await svc.request("GET", "/alerts", token=token, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def submit(svc, token, name):
    r = await svc.request("POST", "/jobs", token=token, json={"code": FAILS, "name": name})
    assert r.status_code == 201, r.text
    return r.json()


async def job_failed_alert(svc, token, job_id) -> dict:
    async def firing():
        return [
            a
            for a in (await alerts(svc, token, state="firing"))["alerts"]
            if a["name"] == "JobFailed" and a["subject"] == job_id
        ]

    [alert] = await wait_until_async(firing, f"JobFailed for job {job_id}", WAIT_S, 0.3)
    return alert


async def test_owner_and_admins_acknowledge_alerts_and_they_resolve(tmp_path, monkeypatch):
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        bob = svc.create_user("bob")
        alice = svc.create_user("alice")
        first = await submit(svc, bob, "shape")
        second = await submit(svc, bob, "other")
        alert = await job_failed_alert(svc, bob, first["id"])
        other = await job_failed_alert(svc, bob, second["id"])
        assert alert["acknowledged_at"] is None and (await alerts(svc, bob))["firing"] == 2

        # Someone else's alert is not theirs to see, nor to acknowledge.
        for path in (f"/alerts/{alert['id']}/ack", "/alerts/99999/ack"):
            r = await svc.request("POST", path, token=alice)
            assert r.status_code == 404, r.text
            assert "no alert" in r.json()["error"]
        r = await svc.request("POST", "/alerts/769943294379313332224/ack", token=bob)
        assert r.status_code == 400, r.text

        # Its owner acknowledges it through the client: resolved, and it stays so.
        seen = await asyncio.to_thread(Client(svc.api, bob).acknowledge_alert, alert["id"])
        assert seen["state"] == "resolved" and seen["acknowledged_by"] == "bob"
        assert seen["acknowledged_at"] and seen["resolved_at"]
        for _ in range(2):  # rounds of the engine: the job is still failed
            await svc.app.alerts.evaluate()
        firing = (await alerts(svc, bob, state="firing"))["alerts"]
        assert [a["subject"] for a in firing] == [second["id"]]
        assert (await alerts(svc, bob))["firing"] == 1
        # Again: nothing changes.
        r = await svc.request("POST", f"/alerts/{alert['id']}/ack", token=bob)
        assert r.status_code == 200 and r.json()["acknowledged_at"] == seen["acknowledged_at"]
        entries = (await svc.request("GET", "/audit?action=alert.acknowledge")).json()["entries"]
        assert [(e["actor"], e["user"]) for e in entries] == [("bob", "bob"), ("bob", "bob")]

        # Submitting the other job again resolves its alert, acknowledged or not.
        await submit(svc, bob, "other")

        async def other_resolved():
            return [
                a
                for a in (await alerts(svc, bob, state="resolved"))["alerts"]
                if a["id"] == other["id"]
            ]

        [gone] = await wait_until_async(other_resolved, "JobFailed resolved", WAIT_S, 0.3)
        assert gone["acknowledged_at"] is None

        # A condition's alert (a shared GPU's): an admin acknowledges it with the magic;
        # it fires on (its cause is there) but no longer counts as firing.
        now = dt.datetime.now(dt.UTC)
        with svc.app.engine.begin() as c:
            xid = c.execute(
                alerts_table.insert().values(
                    key="GpuXidErrors|GPU-1",
                    name="GpuXidErrors",
                    severity="critical",
                    subject_kind="gpu",
                    subject="GPU-1",
                    owner=None,
                    message="XID 79 on node-1 GPU 0: cordoned",
                    labels="{}",
                    since=now,
                    updated=now,
                )
            ).inserted_primary_key[0]
        before = (await alerts(svc))["firing"]
        r = await svc.request("POST", f"/alerts/{xid}/ack", token=bob)
        assert r.status_code == 404  # bob sees no shared GPU's alerts
        monkeypatch.setenv("GPULAB_API_URL", svc.api)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", svc.admin_token)
        shell = InteractiveShell.instance()
        shell.extension_manager.load_extension("gpulab.magics")

        def magic(line):
            with capture_output() as out:
                shell.run_line_magic("gpulab", line)
            shown = [o.data.get("text/plain", "") for o in out.outputs]
            return "\n".join([out.stdout, *shown])

        said = await asyncio.to_thread(magic, f"alerts --ack {xid}")
        assert f"acknowledged GpuXidErrors #{xid} (gpu GPU-1): it still fires" in said, said
        answer = await alerts(svc)
        [row] = [a for a in answer["alerts"] if a["id"] == xid]
        assert row["state"] == "firing" and row["acknowledged_by"] == "admin"
        assert answer["firing"] == before - 1
        listed = await asyncio.to_thread(magic, "alerts")
        assert f"GpuXidErrors #{xid} (acked by admin)" in listed, listed
        said = await asyncio.to_thread(magic, "alerts --ack 99999")
        assert "could not acknowledge alert #99999" in said and "no alert 99999" in said
