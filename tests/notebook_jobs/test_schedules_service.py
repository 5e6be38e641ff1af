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
        # A folder of the time zone database: once an IsADirectoryError, a 500.
        ({"name": "n", "schedule": "0 3 * * *", "timezone": "America", "job": JOB}, "time zone"),
        # Over its column's 255 characters: once PostgreSQL's error, a 500.
        (
            {"name": "n", "schedule": ",".join(["1"] * 200) + " * * * *", "job": JOB},
            "over the 255 a cron line may have",
        ),
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


async def test_on_the_night_clocks_go_back_a_schedule_fires_once(tmp_path):
    """01:59 in New York on 2024-11-03 comes twice; its next run was worked out in the
    offset before the change, which named the run just made again: it was submitted at
    every tick for an hour (3,601 jobs)."""
    start = dt.datetime(2024, 11, 3, 5, 0, tzinfo=dt.UTC).timestamp()  # 01:00 EDT
    with fake_clock(start=start) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            body = {
                "name": "n",
                "schedule": "59 1 * * *",
                "timezone": "America/New_York",
                "job": JOB,
            }
            sched = (await svc.request("POST", "/schedules", alice, json=body)).json()
            assert sched["next_run"] == "2024-11-03T05:59:00+00:00"
            clock.advance(59 * 60)
            assert len(await svc.app.schedules.fire_due()) == 1
            for _ in range(5):
                clock.advance(1)
                assert await svc.app.schedules.fire_due() == []
            clock.advance(3600)  # 01:59 EST: the same wall-clock time, not run again
            assert await svc.app.schedules.fire_due() == []
            after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
            assert after["next_run"] == "2024-11-04T06:59:00+00:00"
            assert len((await svc.request("GET", "/jobs", alice)).json()) == 1


@pytest.mark.parametrize("change", ["pause", "delete", "edit"])
async def test_a_schedule_paused_deleted_or_changed_as_it_is_due_runs_as_it_is_now(
    tmp_path, monkeypatch, change
):
    """The due schedules were read, then each submitted as read: a pause or delete in
    between still ran the old job, and its next run was written over the change."""
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": JOB}
            sched = (await svc.request("POST", "/schedules", alice, json=body)).json()
            rows = svc.app.schedules.rows
            due = rows.due

            def changed_after_read(now):
                found = due(now)
                if change == "pause":
                    rows.update(sched["id"], active=False)
                elif change == "delete":
                    rows.remove(sched["id"])
                else:
                    rows.update(sched["id"], job={**JOB, "name": "edited"})
                return found

            monkeypatch.setattr(rows, "due", changed_after_read)
            clock.advance(2 * 3600)
            fired = await svc.app.schedules.fire_due()
            jobs = (await svc.request("GET", "/jobs", alice)).json()
            if change == "edit":  # the job as it is now
                assert [j["name"] for j in jobs] == ["edited"] and len(fired) == 1
                return
            assert fired == [] and jobs == []
            if change == "pause":
                after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
                assert after["active"] is False and after["last_run"] is None
                assert after["next_run"] == sched["next_run"]
            else:
                r = await svc.request("GET", f"/schedules/{sched['id']}", alice)
                assert r.status_code == 404


async def test_a_run_due_while_the_hub_does_not_answer_is_made_up_once(tmp_path, monkeypatch):
    """The next run was moved on before the hub was asked who the owner is: a run due
    while the hub was down was lost, though the docs say missed runs are made up."""
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice = svc.create_user("alice")
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": JOB}
            sched = (await svc.request("POST", "/schedules", alice, json=body)).json()
            schedules = svc.app.schedules
            asked = schedules.identity_of

            async def hub_down(user, made=None):
                raise ConnectionRefusedError(111, "Connection refused")

            monkeypatch.setattr(schedules, "identity_of", hub_down)
            clock.advance(2 * 3600)
            assert await schedules.fire_due() == []
            after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
            assert after["next_run"] == "2026-12-01T03:01:00+00:00"
            assert after["last_error"].startswith("could not submit (")
            clock.advance(60)
            assert await schedules.fire_due() == []  # still down
            monkeypatch.setattr(schedules, "identity_of", asked)
            clock.advance(60)
            (fired,) = await schedules.fire_due()
            after = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
            assert after["next_run"] == "2026-12-02T03:00:00+00:00"  # made up once
            assert after["last_error"] is None
            runs = (await svc.request("GET", f"/schedules/{sched['id']}/runs", alice)).json()
            assert [r["job_id"] for r in runs] == [fired]


async def test_a_later_user_given_the_owners_name_does_not_inherit_the_schedule(tmp_path):
    """With an authenticator other than gpulab's a deleted user's schedules stay; the
    hub only had to know the name for a run to go as the new user of it."""
    with fake_clock(start=ONE_AM) as clock:
        async with running_service(tmp_path / "svc", CONFIG) as svc:
            await svc.app.schedules.stop()  # this test fires them
            alice, bob = svc.create_user("alice"), svc.create_user("bob")
            users = svc.fake_hub.users
            users["alice"]["created"] = "2026-01-05T10:00:00.000000Z"
            users["bob"]["created"] = "2026-01-05T10:00:00.000000Z"
            body = {"name": "nightly", "schedule": "0 3 * * *", "job": JOB}
            ids = {}
            for name, token in (("alice", alice), ("bob", bob)):
                ids[name] = (await svc.request("POST", "/schedules", token, json=body)).json()["id"]
            # alice is deleted and a new alice made (her schedules stay, as they do
            # with other authenticators).
            users["alice"] = {**users["alice"], "created": "2026-12-01T01:30:00.000000Z"}
            svc.app.hub.forget_memberships()  # as the hub's user.delete event does
            clock.advance(2 * 3600)
            (fired,) = await svc.app.schedules.fire_due()
            (job,) = (await svc.request("GET", "/jobs", params={"user": "bob"})).json()
            assert job["id"] == fired  # bob, unchanged, runs
            assert (await svc.request("GET", "/jobs", params={"user": "alice"})).json() == []
            after = (await svc.request("GET", f"/schedules/{ids['alice']}")).json()
            assert after["active"] is False and "after the schedule's owner" in after["last_error"]
            assert "owner_created" not in after  # the API shows what it did


@pytest.mark.parametrize(
    ("job", "status", "says"),
    [
        ({**JOB, "user": "bob"}, 400, "set by the service, not the client: user"),
        ({**JOB, "priority": 50}, 403, "raising it is for admins"),
        ({**JOB, "priority_class": "urgent"}, 400, "urgent"),
        ({**JOB, "gpu_milli": 300}, 400, "not a slice size offered here"),
        ({**JOB, "vars_b64": "AAAA" * 400_000}, 413, "c.JobQueue.max_job_vars_mib"),
    ],
)
async def test_a_schedule_whose_every_run_would_be_refused_is_refused_when_made(
    tmp_path, job, status, says
):
    """Only the spec's shape was checked when a schedule was made: a job no run could
    submit (another user's, a priority only admins may give, a slice that is not a
    size) was kept and refused at every run."""
    config = CONFIG + "c.JobQueue.max_job_vars_mib = 1\n"
    async with running_service(tmp_path / "svc", config) as svc:
        alice = svc.create_user("alice")
        direct = await svc.request("POST", "/jobs", alice, json=job)
        assert direct.status_code == status, direct.text
        body = {"name": "n", "schedule": "0 3 * * *", "job": job}
        r = await svc.request("POST", "/schedules", alice, json=body)
        assert r.status_code == status and says in r.json()["error"], r.text
        assert direct.json()["error"] in r.json()["error"]  # what POST /jobs says
        body = {"name": "n", "schedule": "0 3 * * *", "job": JOB}
        sched = (await svc.request("POST", "/schedules", alice, json=body)).json()
        r = await svc.request("PATCH", f"/schedules/{sched['id']}", alice, json={"job": job})
        assert r.status_code == status and says in r.json()["error"], r.text
        kept = (await svc.request("GET", f"/schedules/{sched['id']}", alice)).json()
        assert kept["job"] == JOB
