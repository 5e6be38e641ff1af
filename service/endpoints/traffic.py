"""Calls to one version of an endpoint, as the service's router sees them.

The router counts every call it forwards: how many are in flight now (per
replica, so the next call goes to the least busy one), the average in flight
since the autoscaler last asked (the area under the in-flight curve, so a
burst between two samples is not missed), and over the last minute the calls,
the errors (5xx, or no replica answered) and a latency histogram, from which
the p99 is read as Prometheus' ``histogram_quantile`` would.

:class:`WeightedChoice` splits calls between versions by weight, exactly
(smooth weighted round robin, as nginx does): 20 of every 100 calls go to a
canary of weight 20, spread out rather than in a run.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

#: Latency bucket bounds (s); the last one catches the rest.
BOUNDS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    float("inf"),
)
SLOT_S = 5.0
WINDOW_SLOTS = 12  # one minute


def quantile_ms(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of cumulative ``le`` buckets, interpolated within its bucket as
    Prometheus' ``histogram_quantile`` does; in ms. None without observations."""
    total = buckets.get(float("inf"), 0)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in sorted(buckets):
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower * 1000  # beyond the largest bound: report that bound
            inside = buckets[le] - below
            fraction = (rank - below) / inside if inside > 0 else 1.0
            return (lower + (le - lower) * fraction) * 1000
        lower, below = le, buckets[le]
    return None


@dataclass
class _Slot:
    start: float
    calls: int = 0
    errors: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(BOUNDS))


class UnitTraffic:
    """One version's calls: in flight now, averaged between samples, the last minute."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.inflight: dict[int, int] = {}  # replica -> calls it holds now
        self.waiting = 0  # calls waiting for a replica to start (a cold start)
        self.calls_total = 0
        self.errors_total = 0
        self._area = 0.0  # integral of (in flight + waiting) over time
        self._since = self._sampled_at = clock()
        self._slots: deque[_Slot] = deque(maxlen=WINDOW_SLOTS)

    # -- counting ----------------------------------------------------------------------
    def busy(self) -> int:
        return sum(self.inflight.values()) + self.waiting

    def _account(self) -> None:
        now = self.clock()
        self._area += self.busy() * (now - self._since)
        self._since = now

    def start_wait(self) -> None:
        self._account()
        self.waiting += 1

    def end_wait(self) -> None:
        self._account()
        self.waiting -= 1

    def begin(self, replica: int) -> None:
        self._account()
        self.inflight[replica] = self.inflight.get(replica, 0) + 1

    def end(self, replica: int | None, seconds: float, error: bool) -> None:
        """A call is answered (``replica`` None: it never reached one)."""
        if replica is not None:
            self._account()
            left = self.inflight.get(replica, 1) - 1
            if left:
                self.inflight[replica] = left
            else:
                self.inflight.pop(replica, None)
        self.calls_total += 1
        self.errors_total += error
        slot = self._slot()
        slot.calls += 1
        slot.errors += error
        for i, bound in enumerate(BOUNDS):
            if seconds <= bound:
                slot.buckets[i] += 1
                break

    def _slot(self) -> _Slot:
        now = self.clock()
        if not self._slots or now - self._slots[-1].start >= SLOT_S:
            self._slots.append(_Slot(now))
        return self._slots[-1]

    def least_busy(self, replicas: list[tuple[int, str]]) -> tuple[int, str]:
        """The replica holding the fewest calls (the first of equals)."""
        return min(replicas, key=lambda r: self.inflight.get(r[0], 0))

    # -- reading -----------------------------------------------------------------------
    def sample(self) -> float:
        """The average number of calls in flight (or waiting) since the last sample."""
        self._account()
        now = self.clock()
        span = now - self._sampled_at
        average = self._area / span if span > 0 else float(self.busy())
        self._area, self._sampled_at = 0.0, now
        return average

    def window(self) -> dict:
        """The last minute: calls, errors, calls per second, p99 latency (ms)."""
        now = self.clock()
        slots = [s for s in self._slots if now - s.start < SLOT_S * WINDOW_SLOTS]
        calls = sum(s.calls for s in slots)
        errors = sum(s.errors for s in slots)
        cumulative, running = {}, 0
        for i, bound in enumerate(BOUNDS):
            running += sum(s.buckets[i] for s in slots)
            cumulative[bound] = running
        span = max(SLOT_S, now - slots[0].start) if slots else SLOT_S
        return {
            "calls": calls,
            "errors": errors,
            "error_rate": errors / calls if calls else 0.0,
            "requests_per_second": calls / span,
            "p99_latency_ms": quantile_ms(cumulative, 0.99),
            "cumulative": cumulative,  # le -> calls, to add versions up
        }


class WeightedChoice:
    """Smooth weighted round robin over keys with integer weights."""

    def __init__(self):
        self._current: dict[str, int] = {}

    def pick(self, weights: dict[str, int]) -> str | None:
        live = {k: w for k, w in weights.items() if w > 0}
        if not live:
            return None
        total = sum(live.values())
        for k in list(self._current):
            if k not in live:
                del self._current[k]
        best = None
        for k, w in live.items():
            self._current[k] = self._current.get(k, 0) + w
            if best is None or self._current[k] > self._current[best]:
                best = k
        self._current[best] -= total
        return best
