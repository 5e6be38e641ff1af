"""Recent telemetry in memory: bounded per node, by age and by count.

Telemetry is a view of now, not a record: a restart of the service loses it,
and the agents (or the local sampler) refill it within seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class TelemetryStore:
    def __init__(self, max_age_s: float = 900.0, max_samples: int = 1200, max_allreduce: int = 50):
        self.max_age_s = max_age_s
        self._samples: dict[str, deque] = {}
        self._max_samples = max_samples
        self._allreduce: deque = deque(maxlen=max_allreduce)
        self._lock = threading.Lock()
        #: Called with each sample once it is stored (the self-healing judges it).
        self.listeners: list[Callable[[dict], None]] = []

    def add(self, sample: dict) -> None:
        with self._lock:
            q = self._samples.setdefault(sample["node"], deque(maxlen=self._max_samples))
            q.append(sample)
            # Results an agent measured; the local sampler sends none.
            for result in sample.get("allreduce") or []:
                self._allreduce.append({**result, "node": sample["node"], "user": None})
            self._trim(q)
        for listener in self.listeners:
            listener(sample)

    def _trim(self, q: deque) -> None:
        cutoff = time.time() - self.max_age_s
        while q and q[0]["ts"] < cutoff:
            q.popleft()

    def since(self, ts: float | None) -> dict[str, list[dict]]:
        with self._lock:
            out = {}
            for node, q in self._samples.items():
                self._trim(q)
                out[node] = [s for s in q if ts is None or s["ts"] > ts]
            return out

    def latest(self) -> list[dict]:
        with self._lock:
            return [q[-1] for q in self._samples.values() if q]

    def latest_for(self, node: str) -> dict | None:
        with self._lock:
            q = self._samples.get(node)
            return q[-1] if q else None

    def latest_for_export(self) -> list[dict]:
        """Latest sample per node, carrying that node's latest all-reduce result."""
        with self._lock:
            runs = {r["node"]: r for r in self._allreduce}
            return [
                {**q[-1], "allreduce": [runs[n]] if n in runs else []}
                for n, q in self._samples.items()
                if q
            ]

    def add_allreduce(self, result: dict) -> None:
        with self._lock:
            self._allreduce.append(result)

    def allreduce(self) -> list[dict]:
        with self._lock:
            return list(self._allreduce)
