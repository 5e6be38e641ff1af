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

The samples it keeps are one per second at most (the loop runs up to five times a
second while a call waits for a cold start; those of one second are kept as one),
for ``scale_down_delay_s`` at most :data:`MAX_SCALE_DOWN_DELAY_S`, in a bounded deque
read from its newest end: a pass costs what the window holds, however long it is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

UP_WINDOW_S = 3.0
#: The longest scale-down delay (an hour: the HPA's longest stabilisation window too).
MAX_SCALE_DOWN_DELAY_S = 3600.0
#: The samples of one second are kept as one.
SAMPLE_S = 1.0
#: The most seconds of samples ever kept.
MAX_SAMPLES = int(MAX_SCALE_DOWN_DELAY_S + UP_WINDOW_S) + 2


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
    #: One per second at most: [time of its first sample, sum, count, peak].
    samples: deque = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    changed_at: float = 0.0

    @property
    def delay_s(self) -> float:
        """The scale-down delay in force (a row of before the cap may hold more)."""
        return min(self.scale_down_delay_s, MAX_SCALE_DOWN_DELAY_S)

    def observe(self, now: float, inflight: float) -> None:
        last = self.samples[-1] if self.samples else None
        if last is not None and 0 <= now - last[0] < SAMPLE_S:
            last[1] += inflight
            last[2] += 1
            last[3] = max(last[3], inflight)
        else:
            self.samples.append([now, inflight, 1, inflight])
        keep = max(self.delay_s, UP_WINDOW_S)
        while self.samples and now - self.samples[0][0] > keep:
            self.samples.popleft()

    def _newest(self, now: float, seconds: float):
        """The samples of the last ``seconds``, newest first."""
        for sample in reversed(self.samples):
            if now - sample[0] > seconds:
                return
            yield sample

    def decide(self, now: float, current: int, waiting: int = 0) -> int:
        """The count to run from now (``current`` if nothing should change)."""
        low, high = self.min_replicas, self.max_replicas
        if low == high:
            return low
        if current == 0 and waiting:
            return max(1, low)
        total = count = 0
        for _, summed, n, _ in self._newest(now, UP_WINDOW_S):
            total, count = total + summed, count + n
        up = needed(total / count, self.target_inflight) if count else 0
        if up > current:
            return min(max(up, low), high)
        delay = self.delay_s
        if current > low and now - self.changed_at >= delay:
            peak = max((s[3] for s in self._newest(now, delay)), default=0.0)
            down = max(needed(peak, self.target_inflight), low)
            if down < current:
                return down
        return max(min(current, high), low)

    def changed(self, now: float) -> None:
        self.changed_at = now
