"""gpulab's one clock (``gpulab.db.clock``) and the tests' fake one (``support.clock``):
real unless a test installs the fake, and the real one again afterwards."""

import datetime as dt

import pytest
from support.clock import fake_clock

from gpulab.db import clock
from gpulab.db.engine import utcnow

START = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def test_the_fake_clock_moves_only_when_advanced_and_every_reader_sees_it():
    with fake_clock(start=START.timestamp()) as fake:
        before = clock.monotonic()
        assert (clock.utcnow(), utcnow(), clock.now()) == (START, START, START.timestamp())
        fake.advance(3600)
        assert utcnow() == START + dt.timedelta(hours=1)  # the tables' timestamps too
        assert clock.monotonic() - before == pytest.approx(3600)
        with pytest.raises(ValueError, match="does not go back"):
            fake.advance(-1)


def test_a_ticking_fake_clock_runs_on_and_jumps_ahead():
    with fake_clock(start=START.timestamp(), ticking=True) as fake:
        fake.advance(600)
        assert clock.utcnow() >= START + dt.timedelta(seconds=600)


def test_the_real_clock_is_back_after_a_fake_one():
    with fake_clock(start=START.timestamp()):
        pass
    # The source now is the real one (use() hands back the one it replaces).
    assert clock.use(clock.REAL) is clock.REAL
