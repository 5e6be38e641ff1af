"""A fake clock for tests: time passes when the test says so, not by sleeping.

``with fake_clock() as clock:`` makes every time gpulab judges by in this process
(:mod:`gpulab.db.clock`: usage, fair share, alerts' ``for``, stalled jobs, GPU-idle
culling, the autoscaler's delays) read ``clock``; ``clock.advance(3600)`` is an
hour gone at once. Afterwards the real clock is back.

Two kinds:

* ``fake_clock()``: frozen. Time moves only by ``advance``, so a slice placed and
  held for ``advance(3600)`` counts exactly 3,600 s.
* ``fake_clock(ticking=True)``: real time goes on as well, and ``advance`` jumps
  ahead of it. For tests with real processes (job ranks) that stamp what they
  report with their own, real clock: a report made a moment ago is then a moment
  old, and ``advance(600)`` makes it ten minutes old.

Only this process's clock is fake: a hub or service in a process of its own keeps
the real one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator

from gpulab.db import clock as gpulab_clock


class FakeClock:
    """``now()`` (unix seconds), ``monotonic()``, ``utcnow()``; ``advance(seconds)``."""

    def __init__(self, start: float | None = None, ticking: bool = False):
        self._start = time.time() if start is None else float(start)
        # Monotonic from where the real one is: installed mid-run, it never goes back.
        self._monotonic_start = time.monotonic()
        self._ticking_from = self._monotonic_start if ticking else None
        self._advanced = 0.0

    def _elapsed(self) -> float:
        real = 0.0 if self._ticking_from is None else time.monotonic() - self._ticking_from
        return real + self._advanced

    def now(self) -> float:
        return self._start + self._elapsed()

    def monotonic(self) -> float:
        return self._monotonic_start + self._elapsed()

    def utcnow(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.now(), dt.UTC)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass at once."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self._advanced += seconds


@contextlib.contextmanager
def fake_clock(start: float | None = None, ticking: bool = False) -> Iterator[FakeClock]:
    """Install a :class:`FakeClock` as gpulab's clock for the ``with`` block."""
    clock = FakeClock(start, ticking)
    previous = gpulab_clock.use(clock)
    try:
        yield clock
    finally:
        gpulab_clock.use(previous)
