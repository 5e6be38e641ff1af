"""The clock gpulab reads when time decides something: the one seam for a fake clock.

Stored times (an allocation's ``created``, its release, a job's start) and the
durations that decide what happens next (GPU time used, fair-share decay, how long
an alert's finding has held, how long a job sent no ``report()``, when a GPU-idle
server is stopped, the autoscaler's scale-down delay) all read this module, never
``time.time()`` or ``datetime.now()`` directly. So one call, :func:`use`, moves
all of them together: tests install ``tests/support/clock.py``'s ``FakeClock`` and
advance an hour instead of waiting one.

By default it is the real clock. Timeouts that wait for real things (a replica's
calls to drain, a process to exit) keep to the real clock: a fake hour must not
cut them short. The clock is this process's: a service in another process (a hub
started by ``gpulab up``) keeps its own.

It lives in ``db/``, the room every other room that keeps or judges time may
import (``scheduler/``, ``service/``), because the tables' own timestamps come
from it too (:func:`gpulab.db.engine.utcnow`).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


class Source(Protocol):
    """What a clock gives: unix seconds, and seconds that never run backwards."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...


class RealClock:
    """The machine's clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


REAL = RealClock()
_source: Source = REAL


def now() -> float:
    """Unix seconds now (``time.time()`` unless a fake clock is in use)."""
    return _source.now()


def monotonic() -> float:
    """Seconds for measuring durations (``time.monotonic()`` unless a fake clock is in use)."""
    return _source.monotonic()


def utcnow() -> dt.datetime:
    """Now as an aware UTC datetime, from the same clock as :func:`now`."""
    return dt.datetime.fromtimestamp(_source.now(), dt.UTC)


def use(source: Source) -> Source:
    """Read time from ``source`` from now on (:data:`REAL` for the real clock);
    returns the one used before, to put it back."""
    global _source
    previous, _source = _source, source
    return previous
