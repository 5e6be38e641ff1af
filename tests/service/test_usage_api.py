"""GET /usage on the real service (in-process, a stand-in hub API): GPU time per user,
group and kind adds up to the allocations' own durations, across a restart."""

import asyncio
import datetime as dt

import pytest
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


def seconds(rows) -> float:
    return sum(
        (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(r["created"])).total_seconds()
        for r in rows
    )


async def test_usage_adds_up_across_a_restart_by_user_group_and_kind(tmp_path):
    data = tmp_path / "svc"
    async with running_service(data) as svc:
        alice = svc.create_user("alice", groups=["lab"])
        bob = svc.create_user("bob")
        running(svc, "alice", "bob")
        a = await allocate(svc, "alice", "alice/", 500)
        b = await allocate(svc, "bob", "bob/", 250)
        await asyncio.sleep(1.5)
    # A restart: the slices are still held, their time still counts.
    async with running_service(data, fake_hub=svc.fake_hub) as svc:
        await asyncio.sleep(1.0)
        running(svc, "bob")  # alice's server stopped; the spawner releases its slice
        r = await svc.request(
            "DELETE", "/allocations", params={"owner_kind": "server", "owner": "alice/"}
        )
        assert r.status_code == 200
        alice_s = (
            dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(a[0]["created"])
        ).total_seconds()
        bob_s = seconds(b)

        rows = (await svc.request("GET", "/usage")).json()["rows"]
        got = {r["user"]: r for r in rows}
        assert set(got) == {"alice", "bob"}
        assert abs(got["alice"]["milli_gpu_seconds"] - 500 * alice_s) <= 500  # within 1 s
        assert abs(got["bob"]["milli_gpu_seconds"] - 250 * bob_s) <= 250 * 1.5
        assert got["alice"]["gpu_hours"] == pytest.approx(
            got["alice"]["milli_gpu_seconds"] / 3.6e6, abs=1e-6
        )

        by_kind = (await svc.request("GET", "/usage", params={"group_by": "kind"})).json()
        assert [r["kind"] for r in by_kind["rows"]] == ["server"]
        by_group = (await svc.request("GET", "/usage", params={"group_by": "group"})).json()
        assert {r["group"] for r in by_group["rows"]} == {"lab", ""}

        # Users see their own use only; admins anyone's.
        mine = (await svc.request("GET", "/usage", token=bob)).json()["rows"]
        assert [r["user"] for r in mine] == ["bob"]
        r = await svc.request("GET", "/usage", token=bob, params={"user": "alice"})
        assert r.status_code == 403
        mine = (await svc.request("GET", "/usage", token=alice, params={"group_by": "kind"})).json()
        assert mine["rows"][0]["milli_gpu_seconds"] == got["alice"]["milli_gpu_seconds"]

        csv = await svc.request("GET", "/usage", params={"format": "csv"})
        assert csv.headers["Content-Type"].startswith("text/csv")
        lines = csv.text.splitlines()
        assert lines[0] == "user,gpu_hours,milli_gpu_seconds,allocations"
        assert len(lines) == 3

        # The counter Prometheus scrapes, in GPU-seconds.
        metrics = (await svc.request("GET", "/../../metrics")).text
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith('gpulab_gpu_seconds_total{kind="server"}')
        )
        assert float(line.split()[-1]) >= (500 * alice_s + 250 * bob_s) / 1000 - 1


async def test_usage_per_day_adds_up_to_the_window_and_users_see_their_own(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        svc.create_user("carol", groups=["lab"])
        dave = svc.create_user("dave", groups=["lab"])
        running(svc, "carol", "dave")
        await allocate(svc, "carol", "carol/", 500)
        await allocate(svc, "dave", "dave/", 250)
        await asyncio.sleep(1.0)
        # One fixed window for every call: held slices count up to its end.
        until = dt.datetime.now(dt.UTC)
        window = {"since": (until - dt.timedelta(hours=1)).isoformat(), "until": until.isoformat()}

        whole = (await svc.request("GET", "/usage", params=window)).json()
        per_day = (await svc.request("GET", "/usage", params={**window, "bucket": "day"})).json()
        assert (whole["bucket"], per_day["bucket"]) == (None, "day")
        days = {(until - dt.timedelta(hours=1)).date().isoformat(), until.date().isoformat()}
        assert per_day["rows"] and {r["day"] for r in per_day["rows"]} <= days
        for row in whole["rows"]:
            split = [r for r in per_day["rows"] if r["user"] == row["user"]]
            assert sum(r["milli_gpu_seconds"] for r in split) == pytest.approx(
                row["milli_gpu_seconds"], abs=len(split)
            )
        assert {r["user"] for r in whole["rows"]} == {"carol", "dave"}

        by_group = {**window, "bucket": "day", "group_by": "group", "format": "csv"}
        csv = await svc.request("GET", "/usage", params=by_group)
        lines = csv.text.splitlines()
        assert lines[0] == "day,group,gpu_hours,milli_gpu_seconds,allocations"
        assert {line.split(",")[1] for line in lines[1:]} == {"lab"}

        mine = await svc.request("GET", "/usage", token=dave, params={**window, "bucket": "day"})
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
