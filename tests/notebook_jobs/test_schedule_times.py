"""When a schedule's next run is (``next_run``), on the days the clocks change: pure
functions, no service.

croniter works in the UTC offset of the time it starts from, so the next run was
worked out in the offset before a change of daylight saving time: on the night
clocks go back, ``59 1 * * *`` in New York named the run just made again (it fired
at every tick for an hour), and the first run after each change was an hour off.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from croniter import croniter

from gpulab.service.jobs.schedules import ScheduleRefused, check_schedule, next_run

UTC = dt.UTC


def at(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "zone", "after", "expected"),
    [
        # New York, clocks back (2024-11-03 02:00 EDT -> 01:00 EST): 01:59 EDT runs
        # once; the next is tomorrow's 01:59 EST, not the same instant again.
        ("59 1 * * *", "America/New_York", at(2024, 11, 3, 5, 59), at(2024, 11, 4, 6, 59)),
        # 09:00 the day after the change is 09:00 EST (14:00 UTC), not 08:00.
        ("0 9 * * *", "America/New_York", at(2024, 11, 2, 13, 0), at(2024, 11, 3, 14, 0)),
        # Monday 00:30 EST, not Sunday 23:30.
        ("30 0 * * 1", "America/New_York", at(2024, 11, 2, 12, 0), at(2024, 11, 4, 5, 30)),
        # New York, clocks forward (2024-03-10 02:00 EST -> 03:00 EDT): 02:30 does not
        # exist and runs as the clocks change (03:00 EDT), as cron does; 09:00 is EDT.
        ("30 2 * * *", "America/New_York", at(2024, 3, 10, 6, 0), at(2024, 3, 10, 7, 0)),
        ("30 2 * * *", "America/New_York", at(2024, 3, 10, 7, 0), at(2024, 3, 11, 6, 30)),
        ("0 9 * * *", "America/New_York", at(2024, 3, 9, 14, 0), at(2024, 3, 10, 13, 0)),
        # Berlin: 02:30 on 2024-10-27 happens twice, the first (CEST) is the run; on
        # 2024-03-31 it does not happen, and runs at 03:00 CEST.
        ("30 2 * * *", "Europe/Berlin", at(2024, 10, 26, 23, 0), at(2024, 10, 27, 0, 30)),
        ("30 2 * * *", "Europe/Berlin", at(2024, 10, 27, 0, 30), at(2024, 10, 28, 1, 30)),
        ("30 2 * * *", "Europe/Berlin", at(2024, 3, 30, 23, 0), at(2024, 3, 31, 1, 0)),
        ("0 9 * * *", "Europe/Berlin", at(2024, 10, 26, 7, 0), at(2024, 10, 27, 8, 0)),
        # Sydney, the other way round: back on 2024-04-07, forward on 2024-10-06.
        ("30 2 * * *", "Australia/Sydney", at(2024, 4, 6, 12, 0), at(2024, 4, 6, 15, 30)),
        ("30 2 * * *", "Australia/Sydney", at(2024, 4, 6, 15, 30), at(2024, 4, 7, 16, 30)),
        ("30 2 * * *", "Australia/Sydney", at(2024, 10, 5, 12, 0), at(2024, 10, 5, 16, 0)),
        ("0 9 * * *", "Australia/Sydney", at(2024, 10, 5, 12, 0), at(2024, 10, 5, 22, 0)),
    ],
)
def test_the_next_run_is_the_wall_clock_time_the_cron_names_across_a_change(
    cron, zone, after, expected
):
    assert next_run(cron, zone, after) == expected


#: (zone, a day on which its clocks go back, one on which they go forward)
CHANGES = [
    ("America/New_York", dt.date(2024, 11, 3), dt.date(2024, 3, 10)),
    ("Europe/Berlin", dt.date(2024, 10, 27), dt.date(2024, 3, 31)),
    ("Australia/Sydney", dt.date(2024, 4, 7), dt.date(2024, 10, 6)),
]
CRONS = ["59 1 * * *", "30 2 * * *", "0 3 * * *", "0 9 * * *", "30 0 * * 1", "*/20 * * * *"]


def _in_a_gap(when: dt.datetime, zone: zoneinfo.ZoneInfo) -> bool:
    """Whether the clocks jumped forward at ``when`` (its offset differs from a
    minute before's)."""
    return (when - dt.timedelta(minutes=1)).astimezone(zone).utcoffset() != when.astimezone(
        zone
    ).utcoffset()


@pytest.mark.parametrize(("zone_name", "back", "forward"), CHANGES)
@pytest.mark.parametrize("cron", CRONS)
def test_runs_over_the_days_the_clocks_change_go_forward_at_the_named_times(
    zone_name, back, forward, cron
):
    """Every run is after the one before (never the same or a past instant) and at the
    wall-clock time the cron names, or, where the clocks skip that time, as they skip."""
    zone = zoneinfo.ZoneInfo(zone_name)
    for day in (back, forward):
        start = dt.datetime.combine(day - dt.timedelta(days=2), dt.time(), zone).astimezone(UTC)
        end = start + dt.timedelta(days=5)
        when, runs = start, []
        while when < end:
            following = next_run(cron, zone_name, when)
            assert following > when, (cron, zone_name, when, following)
            local = following.astimezone(zone)
            assert croniter.match(cron, local.replace(tzinfo=None)) or _in_a_gap(following, zone), (
                cron,
                zone_name,
                local,
            )
            runs.append(following)
            when = following
        assert len(runs) == len(set(runs))
        if cron.startswith(("59 ", "30 2", "0 3", "0 9")):  # once a day, each day
            days = [r.astimezone(zone).date() for r in runs if r < end]
            assert len(days) == len(set(days)) == 5, (cron, zone_name, runs)


@pytest.mark.parametrize(
    ("schedule", "timezone", "says"),
    [
        # A folder of the time zone database: IsADirectoryError, once a 500.
        ("0 3 * * *", "America", "is not a time zone name"),
        ("0 3 * * *", "Europe/" + "x" * 300, "is not a time zone name"),
        # Over the column's 255 characters: an error of PostgreSQL's, once a 500.
        (",".join(["1"] * 200) + " * * * *", "UTC", "over the 255 a cron line may have"),
    ],
)
def test_a_time_zone_folder_or_an_overlong_line_is_a_400(schedule, timezone, says):
    with pytest.raises(ScheduleRefused) as e:
        check_schedule(schedule, timezone)
    assert e.value.status == 400 and says in str(e.value)
