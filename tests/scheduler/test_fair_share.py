"""Fair share: past GPU time weighs less as it ages (``gpulab.db.usage.UsageStore.decayed``, which
the job queue orders users of one class by, least first).

A real ledger on a real SQLite file; time passes on a fake clock (``support.clock``),
so "a GPU-hour one half-life ago" is an hour held and a half-life advanced.
"""

import math

import pytest
from support.clock import fake_clock

from gpulab.db.usage import UsageStore

HOUR = 3600.0
HALF_LIFE = 86400.0  # a day, as c.JobQueue.fair_share_half_life_seconds may say


def an_hour_now(half_life: float = HALF_LIFE) -> float:
    """What a whole GPU for the last hour weighs now: a little under 3.6 M milli-GPU-s."""
    k = math.log(2) / half_life
    return 1000 * (1 - math.exp(-k * HOUR)) / k


def test_a_gpu_hour_one_half_life_ago_counts_half(ledger):
    with fake_clock() as clock:
        ledger.allocate("alice", "server", "alice/", 1000)
        clock.advance(HOUR)
        ledger.release("server", "alice/")
        fresh = UsageStore(ledger.engine).decayed(HALF_LIFE)
        clock.advance(HALF_LIFE)
        a_day_on = UsageStore(ledger.engine).decayed(HALF_LIFE)
        clock.advance(HALF_LIFE)
        two_days_on = UsageStore(ledger.engine).decayed(HALF_LIFE)
    assert fresh["alice"] == pytest.approx(an_hour_now())
    assert a_day_on["alice"] == pytest.approx(an_hour_now() / 2)
    assert two_days_on["alice"] == pytest.approx(an_hour_now() / 4)


def test_a_held_slice_counts_up_to_now_and_recent_use_outweighs_old(ledger):
    """Alice used a whole GPU for an hour two days ago; Bob holds half a GPU since an
    hour ago. Bob's half hour now outweighs Alice's old hour: Alice goes first."""
    with fake_clock() as clock:
        ledger.allocate("alice", "job", "j1/0", 1000)
        clock.advance(HOUR)
        ledger.release("job", "j1/0")
        clock.advance(2 * HALF_LIFE - HOUR)
        ledger.allocate("bob", "server", "bob/", 500)
        clock.advance(HOUR)
        weights = UsageStore(ledger.engine).decayed(HALF_LIFE)
    assert weights["bob"] == pytest.approx(an_hour_now() / 2)  # still held: up to now
    assert weights["alice"] == pytest.approx(an_hour_now() / 4)
    assert sorted(weights, key=weights.get) == ["alice", "bob"]


def test_use_older_than_ten_half_lives_is_not_read(ledger):
    with fake_clock() as clock:
        ledger.allocate("carol", "server", "carol/", 1000)
        clock.advance(HOUR)
        ledger.release("server", "carol/")
        clock.advance(10 * HALF_LIFE + HOUR)
        assert UsageStore(ledger.engine).decayed(HALF_LIFE) == {}
