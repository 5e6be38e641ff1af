"""Scheduled jobs in the service (``/schedules``): the real service in this process,
its clock a fake one, so a schedule due at 03:00 fires when the test says it is."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from support.clock import fake_clock
from support.service import running_service
from support.wait import wait_until_async

from gpulab.backend.jobdir import JobDir
from gpulab.hub_ext.user_removal import stop_work
from gpulab.spawner.service_client import ServiceClient

#: 01:00 UTC: the next 03:00 is two hours away.
ONE_AM = dt.datetime(2026, 12, 1, 1, 0, tzinfo=dt.UTC).timestamp()
CONFIG = "c.GpuLabService.stop_work_on_exit = True\n"
JOB = {"code": "print('nightly')", "name": "nightly", "gpu_milli": 0}


async def test_a_schedule_submits_its_job_as_its_owner_when_its_time_comes(tmp_path):
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            alice, bob = svc.create_user("alice"), svc.create_user("bob")
            r = await svc.request(
                "POST",
                "/schedules",
                alice,
                json={"name": "Nightly retrain", "schedule": "0 3 * * *", "job": JOB},
            )
            assert r.status_code == 201, r.text
            sched = r.json()
            assert (sched["user"], sched["timezone"], sched["active"]) == ("alice", "UTC", True)
            assert sched["next_run"] == "2026-12-01T03:00:00+00:00"

            # Not before its time...
            clock.advance(3600)
            assert await svc.app.schedules.fire_due() == []
            # ...then once, as alice, and the next run is tomorrow's.
            clock.advance(3600)

            async def fired():
                runs = (await svc.request("GET", f"/schedules/{sched['id']}/runs", alice)).json()
                return runs or None

            (run,) = await wait_until_async(fired, "the schedule to fire", 30)
            job = (await svc.request("GET", f"/jobs/{run['job_id']}", alice)).json()
            assert (job["user"], job["name"]) == ("alice", "nightly")
            # The audit trail says the service submitted it for alice.
            (entry,) = (
                await svc.request(
                    "GET", "/audit", params={"action": "job.submit", "subject": run["job_id"]}
                )
            ).json()["entries"]
            assert (entry["user"], entry["actor_kind"]) == ("alice", "system")
            assert entry["detail"]["schedule"] == sched["id"]
            after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
            assert after["next_run"] == "2026-12-02T03:00:00+00:00"
            assert after["last_error"] is None

            # bob sees none of it, and can neither change nor delete it.
            assert (await svc.request("GET", "/schedules", bob)).json() == []
            for method in ("GET", "DELETE"):
                r = await svc.request(method, f"/schedules/{sched['id']}", bob)
                assert r.status_code == 404
            r = await svc.request("PATCH", f"/schedules/{sched['id']}", bob, json={"active": False})
            assert r.status_code == 404
            assert (await svc.request("GET", f"/jobs/{run['job_id']}", bob)).status_code == 404

            # Paused, it does not fire; deleted, it is gone (its job stays alice's).
            r = await svc.request(
                "PATCH", f"/schedules/{sched['id']}", alice, json={"active": False}
            )
            assert r.status_code == 200 and r.json()["active"] is False
            clock.advance(86400)
            assert await svc.app.schedules.fire_due() == []
            r = await svc.request("DELETE", f"/schedules/{sched['id']}", alice)
            assert r.status_code == 204
            assert (await svc.request("GET", "/schedules", alice)).json() == []
            assert (await svc.request("GET", f"/jobs/{run['job_id']}", alice)).status_code == 200


async def test_the_cron_reads_in_the_schedules_time_zone(tmp_path):
    with fake_clock(start=ONE_AM):
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            alice = svc.create_user("alice")
            body = {"name": "n", "schedule": "0 3 * * *", "timezone": "Asia/Shanghai", "job": JOB}
            r = await svc.request("POST", "/schedules", alice, json=body)
            # 03:00 in Shanghai is 19:00 UTC the day before: the next is 19:00 today.
            assert r.json()["next_run"] == "2026-12-01T19:00:00+00:00"


@pytest.mark.parametrize(
    "body, message",
    [
        ({"name": "n", "schedule": "every night", "job": JOB}, "cron line of five fields"),
        ({"name": "n", "schedule": "99 3 * * *", "job": JOB}, "is not a cron line"),
        # Well formed, but no month has a 30th of February: once a 500 at its next run.
        ({"name": "n", "schedule": "0 0 30 2 *", "job": JOB}, "never matches a date"),
        # A line break in the name would forge a line of its jobs' event logs.
        (
            {"name": "x)\ncancelled by admin root", "schedule": "0 3 * * *", "job": JOB},
            "holds a control character or line break",
        ),
        ({"name": "n", "schedule": "0 3 * * *", "timezone": "Mars/Base", "job": JOB}, "time zone"),
        ({"name": "n", "schedule": "0 3 * * *", "job": {"name": "x"}}, "'code' is required"),
        ({"name": "n", "schedule": "0 3 * * *", "job": JOB, "when": 1}, "unknown field"),
        ({"name": "", "schedule": "0 3 * * *", "job": JOB}, "'name'"),
        ({"name": "n", "schedule": "0 3 * * *", "job": JOB, "active": "yes"}, "'active'"),
    ],
)
async def test_a_bad_schedule_is_refused_with_what_to_fix(tmp_path, body, message):
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        alice = svc.create_user("alice")
        r = await svc.request("POST", "/schedules", alice, json=body)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]
        assert (await svc.request("GET", "/schedules", alice)).json() == []


async def test_what_one_users_schedules_keep_is_capped_and_said(tmp_path):
    """Each schedule keeps its job body in the service's database and every listing
    reads them all: one user cannot store hundreds of MiB there (they once could keep
    100 schedules of up to the 256 MiB variables limit each)."""
    config = CONFIG + "c.JobQueue.max_schedules_mib = 1\n"
    # About 0.6 MiB each as stored: one fits, two do not.
    job = {**JOB, "vars_b64": "A" * 600_000}
    async with running_service(tmp_path / "svc", config) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        body = {"name": "n", "schedule": "0 3 * * *", "job": job}
        first = await svc.request("POST", "/schedules", alice, json=body)
        assert first.status_code == 201, first.text
        r = await svc.request("POST", "/schedules", alice, json=body)
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert "your other 1 schedule take 0.6 MiB" in error
        assert "c.JobQueue.max_schedules_mib" in error
        # Growing the one she has past the cap is refused the same way, and keeps it.
        big = {"job": {**JOB, "vars_b64": "A" * 1_200_000}}
        r = await svc.request("PATCH", f"/schedules/{first.json()['id']}", alice, json=big)
        assert r.status_code == 413, r.text
        assert "put the data in a folder or dataset the job reads" in r.json()["error"]
        # The listing says how large each job is; the schedule itself holds it.
        (kept,) = (await svc.request("GET", "/schedules", alice)).json()
        assert "job" not in kept and kept["job_bytes"] == len(json.dumps(job))
        kept = (await svc.request("GET", f"/schedules/{kept['id']}", alice)).json()
        assert kept["job"]["vars_b64"] == job["vars_b64"]
        # The cap is each user's: bob's first schedule is his to make.
        r = await svc.request("POST", "/schedules", bob, json=body)
        assert r.status_code == 201, r.text
        # With the cap lowered under what she keeps, she can still pause hers.
        svc.app.schedules.max_bytes = 2**19  # what an admin restarting with 0.5 MiB sets
        r = await svc.request(
            "PATCH", f"/schedules/{first.json()['id']}", alice, json={"active": False}
        )
        assert r.status_code == 200 and r.json()["active"] is False, r.text
        svc.app.schedules.max_bytes = 2**20
        # A body far over it is cut off at the door, naming the setting.
        huge = {**body, "job": {**JOB, "vars_b64": "A" * 3_000_000}}
        r = await svc.request("POST", "/schedules", bob, json=huge)
        assert r.status_code == 413 and "max_schedules_mib" in r.json()["error"]


async def test_a_schedule_whose_run_fails_midway_fires_once_and_holds_up_no_other(
    tmp_path, monkeypatch
):
    """A run's job submitted, then its event log unwritable (a full disk), once left
    the schedule's next run unsaved: it fired again at every tick, and no schedule due
    after it fired at all."""
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            ids = {}
            for name in ("disk-full", "other"):
                body = {"name": name, "schedule": "0 3 * * *", "job": JOB}
                r = await svc.request("POST", "/schedules", alice, json=body)
                assert r.status_code == 201, r.text
                ids[name] = r.json()["id"]
            event = JobDir.event

            def full_disk(jobdir, message):
                if "(disk-full)" in message:
                    raise OSError(28, "No space left on device")
                event(jobdir, message)

            monkeypatch.setattr(JobDir, "event", full_disk)
            clock.advance(2 * 3600)
            assert len(await svc.app.schedules.fire_due()) == 2
            # Each ran once, is recorded, and waits for tomorrow.
            for sid in ids.values():
                runs = (await svc.request("GET", f"/schedules/{sid}/runs", alice)).json()
                assert len(runs) == 1
                sched = (await svc.request("GET", f"/schedules/{sid}", alice)).json()
                assert sched["next_run"] == "2026-12-02T03:00:00+00:00"
            assert await svc.app.schedules.fire_due() == []

            # Whatever else fails in one schedule's run, the others still fire and it
            # does not fire again before its next time.
            rows = svc.app.schedules.rows
            add_run = rows.add_run

            def refused(schedule_id, job_id, fired):
                if schedule_id == ids["disk-full"]:
                    raise OSError(5, "Input/output error")
                add_run(schedule_id, job_id, fired)

            monkeypatch.setattr(rows, "add_run", refused)
            clock.advance(86400)
            (fired,) = await svc.app.schedules.fire_due()
            other = (await svc.request("GET", f"/schedules/{ids['other']}/runs", alice)).json()
            assert [run["job_id"] for run in other][1:] == [fired]
            assert await svc.app.schedules.fire_due() == []
            sched = (await svc.request("GET", f"/schedules/{ids['disk-full']}", alice)).json()
            assert sched["next_run"] == "2026-12-03T03:00:00+00:00"


async def test_a_deleted_users_schedule_is_paused_not_run(tmp_path):
    """The hub deleted alice (without gpulab's authenticator to delete her schedules
    first): her nightly job must not run on, as nobody's or as a later alice's."""
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": JOB}
            sched = (await svc.request("POST", "/schedules", alice, json=body)).json()
            del svc.fake_hub.users["alice"]
            svc.app.hub.forget_memberships()  # as the hub's user.delete event does
            clock.advance(2 * 3600)
            assert await svc.app.schedules.fire_due() == []
            after = (await svc.request("GET", f"/schedules/{sched['id']}")).json()
            assert after["active"] is False
            assert "the hub has no user 'alice'" in after["last_error"]
            assert (await svc.request("GET", f"/schedules/{sched['id']}/runs")).json() == []
            assert (await svc.request("GET", "/jobs", params={"user": "alice"})).json() == []


async def test_a_run_over_its_owners_gpu_hour_budget_is_refused_and_says_why(tmp_path):
    """The budget is judged where every job is submitted: a scheduled run with a GPU
    went past it when only POST /jobs asked."""
    config = CONFIG + 'c.BudgetSettings.user_budget_gpu_hours = {"alice": 0}\n'
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", config) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": {**JOB, "gpu_milli": 250}}
            r = await svc.request("POST", "/schedules", alice, json=body)
            assert r.status_code == 201, r.text
            sched = r.json()
            clock.advance(2 * 3600)
            assert await svc.app.schedules.fire_due() == []
            after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
            assert after["last_error"].startswith(
                "alice has used 0 of their 0 GPU-hours this month"
            ), after
            assert after["active"] is True  # the next period may run it
            assert (await svc.request("GET", f"/schedules/{sched['id']}/runs", alice)).json() == []
            assert (await svc.request("GET", "/jobs", alice)).json() == []


async def test_deleting_a_hub_user_deletes_their_schedules_first(tmp_path):
    """What the hub's delete_user asks of the service (hub_ext.user_removal) with the
    service's token: a later user given the name inherits none of the schedules."""
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        for who in (alice, alice, bob):
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": JOB}
            assert (await svc.request("POST", "/schedules", who, json=body)).status_code == 201
        hub = ServiceClient(svc.api, svc.fake_hub.service_token, retry_seconds=0)
        assert await stop_work(hub, "alice") == (0, 0)
        assert (await svc.request("GET", "/schedules", params={"user": "alice"})).json() == []
        (left,) = (await svc.request("GET", "/schedules")).json()
        assert left["user"] == "bob"
