"""How many replicas a version of an endpoint should run: the autoscaler's rule.

Every second the deployment manager hands :meth:`Autoscaler.decide` the average
number of calls in flight at the router since the last second (calls waiting
for a cold start included). Like Knative's and the HorizontalPodAutoscaler's:

* **up, quickly**: the mean over the last ``UP_WINDOW_S`` seconds divided by the
  target per replica, rounded up, when that is more than run now;
* **down, after the delay**: only to the most that was needed at any second of
  the last ``scale_down_delay_s`` (a stabilisation window), and never sooner
  than that delay after the last change, so a short lull does not shed replicas
  that the next burst needs;
* a call waiting while no replica runs asks for one at once (a cold start).

Within ``[min_replicas, max_replicas]``; ``min_replicas`` 0 lets an idle endpoint
give all its slices back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

UP_WINDOW_S = 3.0


def needed(inflight: float, target: float) -> int:
    """Replicas for ``inflight`` calls at ``target`` each (0 for none)."""
    if inflight <= 1e-9:
        return 0
    return math.ceil(inflight / target - 1e-9)


@dataclass
class Autoscaler:
    min_replicas: int
    max_replicas: int
    target_inflight: float
    scale_down_delay_s: float
    samples: deque = field(default_factory=deque)  # (time, average in flight)
    changed_at: float = 0.0

    def observe(self, now: float, inflight: float) -> None:
        self.samples.append((now, inflight))
        keep = max(self.scale_down_delay_s, UP_WINDOW_S)
        while self.samples and now - self.samples[0][0] > keep:
            self.samples.popleft()

    def decide(self, now: float, current: int, waiting: int = 0) -> int:
        """The count to run from now (``current`` if nothing should change)."""
        low, high = self.min_replicas, self.max_replicas
        if low == high:
            return low
        if current == 0 and waiting:
            return max(1, low)
        recent = [v for t, v in self.samples if now - t <= UP_WINDOW_S]
        up = needed(sum(recent) / len(recent), self.target_inflight) if recent else 0
        if up > current:
            return min(max(up, low), high)
        if current > low and now - self.changed_at >= self.scale_down_delay_s:
            window = [v for t, v in self.samples if now - t <= self.scale_down_delay_s]
            down = max(needed(max(window, default=0.0), self.target_inflight), low)
            if down < current:
                return down
        return max(min(current, high), low)

    def changed(self, now: float) -> None:
        self.changed_at = now
