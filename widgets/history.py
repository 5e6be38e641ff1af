"""A bounded time series in numpy: the last ``capacity`` rows, trimmed by age on read."""

from __future__ import annotations

import math

import numpy as np


def number(value) -> float:
    """A JSON value as a float; ``None`` (not reported) and junk become NaN, never 0."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class Ring:
    """Rows of (t, v0..vk) in preallocated arrays; the oldest row is overwritten first.

    ``t`` is unix seconds. Memory is fixed at construction, so a dashboard left
    open for days holds the same few hundred KiB as one open for a minute.
    """

    def __init__(self, capacity: int, width: int):
        if capacity < 1 or width < 1:
            raise ValueError("capacity and width must be >= 1")
        self._t = np.full(capacity, np.nan)
        self._v = np.full((capacity, width), np.nan)
        self._next = 0
        self._count = 0

    @property
    def capacity(self) -> int:
        return len(self._t)

    def __len__(self) -> int:
        return self._count

    @property
    def last_t(self) -> float:
        return float(self._t[(self._next - 1) % self.capacity]) if self._count else math.nan

    def append(self, t: float, values) -> None:
        self._t[self._next] = t
        self._v[self._next] = [number(v) for v in values]
        self._next = (self._next + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def arrays(self, since: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (t, values) oldest first, only rows newer than ``since``."""
        if self._count < self.capacity:
            t, v = self._t[: self._count], self._v[: self._count]
        else:
            order = np.roll(np.arange(self.capacity), -self._next)
            t, v = self._t[order], self._v[order]
        if since is not None:
            keep = t > since
            t, v = t[keep], v[keep]
        return t.copy(), v.copy()
