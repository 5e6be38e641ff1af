"""GET /usage on the real service (in-process, a stand-in hub API): GPU time per user,
group and kind adds up to the allocations' own durations, across a restart.

Time passes on a fake clock (``support.clock``): a slice held for
``clock.advance(3600)`` has used exactly its share of a GPU for an hour.
"""

import datetime as dt
import time
from types import SimpleNamespace

import pytest
from support.clock import fake_clock
from support.service import running_service

pytestmark = pytest.mark.asyncio


async def allocate(svc, user, owner, milli):
    r = await svc.request(
        "POST",
        "/allocations",
        json={"user": user, "owner_kind": "server", "owner": owner, "gpu_milli": milli},
    )
    assert r.status_code == 201, r.text
    return r.json()


def running(svc, *users) -> None:
    """The stand-in hub says these users' servers run (so nothing reconciles them away)."""
    for name, model in svc.fake_hub.users.items():
        model["servers"] = {"": {"ready": True}} if name in users else {}


#: When the per-day test's clock starts: half an hour before a UTC midnight.
BEFORE_MIDNIGHT = dt.datetime(2026, 11, 30, 23, 30, tzinfo=dt.UTC).timestamp()


async def test_usage_adds_up_across_a_restart_by_user_group_and_kind(tmp_path):
    data = tmp_path / "svc"
    with fake_clock() as clock:
        async with running_service(data) as svc:
            alice = svc.create_user("alice", groups=["lab"])
            bob = svc.create_user("bob")
            running(svc, "alice", "bob")
            await allocate(svc, "alice", "alice/", 500)
            await allocate(svc, "bob", "bob/", 250)
            clock.advance(3600)
        # A restart: the slices are still held, their time still counts.
        async with running_service(data, fake_hub=svc.fake_hub) as svc:
            clock.advance(1800)
            running(svc, "bob")  # alice's server stopped; the spawner releases its slice
            r = await svc.request(
                "DELETE", "/allocations", params={"owner_kind": "server", "owner": "alice/"}
            )
            assert r.status_code == 200
            clock.advance(1800)  # bob holds his a while longer

            rows = (await svc.request("GET", "/usage")).json()["rows"]
            got = {r["user"]: r for r in rows}
            assert set(got) == {"alice", "bob"}
            # Half a GPU for 1.5 hours (released), a quarter GPU for 2 hours (still held).
            assert got["alice"]["milli_gpu_seconds"] == 500 * 5400
            assert got["alice"]["gpu_hours"] == 0.75
            assert got["bob"]["milli_gpu_seconds"] == 250 * 7200
            assert got["bob"]["gpu_hours"] == 0.5

            by_kind = (await svc.request("GET", "/usage", params={"group_by": "kind"})).json()
            assert [(r["kind"], r["gpu_hours"]) for r in by_kind["rows"]] == [("server", 1.25)]
            by_group = (await svc.request("GET", "/usage", params={"group_by": "group"})).json()
            assert {r["group"]: r["gpu_hours"] for r in by_group["rows"]} == {"lab": 0.75, "": 0.5}

            # Users see their own use only; admins anyone's.
            mine = (await svc.request("GET", "/usage", token=bob)).json()["rows"]
            assert [r["user"] for r in mine] == ["bob"]
            r = await svc.request("GET", "/usage", token=bob, params={"user": "alice"})
            assert r.status_code == 403
            mine = (
                await svc.request("GET", "/usage", token=alice, params={"group_by": "kind"})
            ).json()
            assert mine["rows"][0]["milli_gpu_seconds"] == 500 * 5400

            csv = await svc.request("GET", "/usage", params={"format": "csv"})
            assert csv.headers["Content-Type"].startswith("text/csv")
            lines = csv.text.splitlines()
            assert lines[0] == "user,gpu_hours,milli_gpu_seconds,allocations"
            assert lines[1:] == ["alice,0.75,2700000,1", "bob,0.5,1800000,1"]

            # The counter Prometheus scrapes, in GPU-seconds: 0.75 + 0.5 GPU-hours.
            metrics = (await svc.request("GET", "/../../metrics")).text
            line = next(
                x
                for x in metrics.splitlines()
                if x.startswith('gpulab_gpu_seconds_total{kind="server"}')
            )
            assert float(line.split()[-1]) == pytest.approx(1.25 * 3600)


async def test_usage_per_day_adds_up_to_the_window_and_users_see_their_own(tmp_path):
    with fake_clock(start=BEFORE_MIDNIGHT) as clock:
        async with running_service(tmp_path / "svc") as svc:
            svc.create_user("carol", groups=["lab"])
            dave = svc.create_user("dave", groups=["lab"])
            running(svc, "carol", "dave")
            await allocate(svc, "carol", "carol/", 500)
            await allocate(svc, "dave", "dave/", 250)
            clock.advance(3600)  # held from 23:30 to 00:30: half an hour on each day
            until = clock.utcnow()
            window = {
                "since": (until - dt.timedelta(hours=1)).isoformat(),
                "until": until.isoformat(),
            }

            whole = (await svc.request("GET", "/usage", params=window)).json()
            per_day = (
                await svc.request("GET", "/usage", params={**window, "bucket": "day"})
            ).json()
            assert (whole["bucket"], per_day["bucket"]) == (None, "day")
            assert {r["user"]: r["milli_gpu_seconds"] for r in whole["rows"]} == {
                "carol": 500 * 3600,
                "dave": 250 * 3600,
            }
            assert [(r["day"], r["user"], r["milli_gpu_seconds"]) for r in per_day["rows"]] == [
                ("2026-11-30", "carol", 500 * 1800),
                ("2026-11-30", "dave", 250 * 1800),
                ("2026-12-01", "carol", 500 * 1800),
                ("2026-12-01", "dave", 250 * 1800),
            ]
            # A slice held across midnight counts in both days' allocations.
            assert {r["allocations"] for r in per_day["rows"]} == {1}

            by_group = {**window, "bucket": "day", "group_by": "group", "format": "csv"}
            csv = await svc.request("GET", "/usage", params=by_group)
            assert csv.text.splitlines() == [
                "day,group,gpu_hours,milli_gpu_seconds,allocations",
                "2026-11-30,lab,0.375,1350000,2",
                "2026-12-01,lab,0.375,1350000,2",
            ]

            mine = await svc.request(
                "GET", "/usage", token=dave, params={**window, "bucket": "day"}
            )
            assert {r["user"] for r in mine.json()["rows"]} == {"dave"}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"group_by": "team"}, "group_by must be one of user, group, kind"),
        ({"format": "xlsx"}, "format must be json or csv"),
        ({"since": "yesterday"}, "'since' must be an ISO 8601 time"),
        (
            {"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"},
            "'since' must be before",
        ),
        ({"bucket": "week"}, "bucket must be day, or left out for one row per user"),
    ],
)
async def test_bad_usage_queries_say_what_is_wrong(tmp_path, params, message):
    async with running_service(tmp_path / "svc") as svc:
        r = await svc.request("GET", "/usage", params=params)
        assert r.status_code == 400 and r.json()["error"].startswith(message), r.text


async def test_usage_needs_a_token(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        r = await svc.request("GET", "/usage", anonymous=True)
        assert r.status_code in (401, 403)


async def test_a_call_that_just_answered_is_in_the_token_report(tmp_path):
    """A gateway call's row is written off the call's path: the token report asked for
    next waits for it, and takes its "now" after it (one CI run left out a row that
    landed just after the report's end)."""
    with fake_clock(ticking=True) as clock:
        async with running_service(tmp_path / "svc") as svc:
            token = svc.create_user("alice")
            meter = svc.app.deployments.gateway.meter
            record = meter.store.record_many

            def landing_late(*args):  # still being written when the report is asked for
                time.sleep(0.5)
                clock.advance(1)
                return record(*args)

            meter.store.record_many = landing_late
            dep = {"id": "d1", "user": "alice", "name": "chat"}
            meter.count(SimpleNamespace(name="alice"), dep, 1, 5, 8)
            r = await svc.request("GET", "/usage", params={"unit": "tokens"}, token=token)
            assert r.status_code == 200, r.text
            rows = [(x["model"], x["requests"], x["completion_tokens"]) for x in r.json()["rows"]]
            assert rows == [("alice/chat", 1, 8)]


async def test_a_flood_of_calls_is_written_in_a_few_transactions(tmp_path):
    """One writer, as many rows as came meanwhile each time: a flood of cheap calls
    queued one database write each on the service's four database threads before."""
    async with running_service(tmp_path / "svc") as svc:
        token = svc.create_user("alice")
        meter = svc.app.deployments.gateway.meter
        writes = []
        record_many = meter.store.record_many

        def counted(rows):
            writes.append(len(rows))
            return record_many(rows)

        meter.store.record_many = counted
        dep = {"id": "d1", "user": "alice", "name": "chat"}
        for _ in range(300):
            meter.count(SimpleNamespace(name="alice"), dep, 1, 2, 3)
        await meter.flush()
        assert sum(writes) == 300 and len(writes) < 10, writes
        r = await svc.request("GET", "/usage", params={"unit": "tokens"}, token=token)
        rows = [(x["model"], x["requests"], x["total_tokens"]) for x in r.json()["rows"]]
        assert rows == [("alice/chat", 300, 1500)]
