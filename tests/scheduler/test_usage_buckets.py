"""``report(bucket="day")`` on a real SQLite ledger: GPU time cut at UTC midnight.

Rows of released slices are written into the usage table as the ledger writes them
(:func:`closed_row`), with times in the past that no API call could make.
"""

import datetime as dt

import pytest

from gpulab.db.engine import make_engine
from gpulab.db.usage import UsageStore, closed_row, usage

UTC = dt.UTC


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    """November 2026; day 31 is December 1st."""
    return dt.datetime(2026, 11, 1, tzinfo=UTC) + dt.timedelta(
        days=day - 1, hours=hour, minutes=minute
    )


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path}/ledger.sqlite")
    rows = [
        # alice: a whole GPU from 23:00 on the 29th to 02:00 on the 30th (1 h + 2 h)
        ("a1", "alice", "server", 1000, at(29, 23), at(30, 2)),
        # bob: a quarter GPU for 4 h on the 30th, and a job of half a GPU that
        # ran three days, from noon on the 27th to noon on the 30th
        ("b1", "bob", "server", 250, at(30, 8), at(30, 12)),
        ("b2", "bob", "job", 500, at(27, 12), at(30, 12)),
    ]
    with eng.begin() as conn:
        for rid, user, kind, milli, start, end in rows:
            alloc = {
                "id": rid,
                "user": user,
                "owner_kind": kind,
                "owner": f"{user}/{rid}",
                "gpu_uuid": "GPU-sim-0",
                "milli": milli,
                "created": start,
            }
            conn.execute(usage.insert().values(**closed_row(alloc, end)))
    yield eng
    eng.dispose()


def test_a_slice_held_across_midnight_counts_in_each_day_for_its_hours(engine):
    rows = UsageStore(engine).report(at(29, 0), at(31, 0), "user", bucket="day")
    got = {(r["day"], r["user"]): r["gpu_hours"] for r in rows}
    assert got == {
        ("2026-11-29", "alice"): 1.0,
        ("2026-11-29", "bob"): 12.0,  # half a GPU for the whole day
        ("2026-11-30", "alice"): 2.0,
        ("2026-11-30", "bob"): pytest.approx(6.0 + 1.0),  # the job's 12 h, the server's 4 h
    }
    # Day by day, most first within a day; the slice across midnight is in both days.
    assert [(r["day"], r["user"]) for r in rows] == [
        ("2026-11-29", "bob"),
        ("2026-11-29", "alice"),
        ("2026-11-30", "bob"),
        ("2026-11-30", "alice"),
    ]
    assert [r["allocations"] for r in rows] == [1, 1, 2, 1]


def test_the_days_add_up_to_the_whole_window_and_are_clipped_to_it(engine):
    since, until = at(28, 6), at(30, 1)
    report = UsageStore(engine).report
    whole = {r["kind"]: r["milli_gpu_seconds"] for r in report(since, until, "kind")}
    days = UsageStore(engine).report(since, until, "kind", bucket="day")
    assert {r["day"] for r in days} == {"2026-11-28", "2026-11-29", "2026-11-30"}
    for kind, total in whole.items():
        assert sum(r["milli_gpu_seconds"] for r in days if r["kind"] == kind) == pytest.approx(
            total, abs=2
        )
    # The 28th starts at 06:00 (the window's start): bob's job holds 18 h of half a GPU.
    first = next(r for r in days if r["day"] == "2026-11-28")
    assert (first["kind"], first["gpu_hours"]) == ("job", 9.0)
    # The 30th ends at 01:00: alice's server 1 h, bob's job 1 h of half a GPU.
    last = {r["kind"]: r["gpu_hours"] for r in days if r["day"] == "2026-11-30"}
    assert last == {"server": 1.0, "job": 0.5}


def test_an_unknown_bucket_is_refused(engine):
    with pytest.raises(ValueError, match="bucket must be one of day"):
        UsageStore(engine).report(at(29, 0), at(30, 0), bucket="week")
