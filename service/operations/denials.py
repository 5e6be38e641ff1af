"""How many refusals of one caller the audit trail writes a minute.

Every 403 of the service's change routes is an audit entry, written before anything
else on the database's one writer. One caller looping on a refused request (a script
gone wrong, or on purpose) would fill the trail and hold every other change's write
behind its own: past ``per_minute`` of a caller's refusals in a minute, the rest are
counted, not written, and the next one written says how many were not
(``detail.unwritten_denials``), the way syslog says "last message repeated N times".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gpulab.service.operations.audit")

WINDOW_S = 60.0
#: Callers remembered at most; past it, those whose minute has ended are forgotten.
MAX_CALLERS = 10_000


@dataclass
class _Minute:
    start: float
    written: int = 0
    unwritten: int = 0


class DenialThrottle:
    """Whether to write a caller's next refusal, and how many went unwritten before it."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._callers: dict[str, _Minute] = {}

    def admit(self, caller: str) -> int | None:
        """None: count this refusal, do not write it. Otherwise write it, with the
        returned number of this caller's refusals not written before it."""
        now = self.clock()
        minute = self._callers.get(caller)
        if minute is None or now - minute.start >= WINDOW_S:
            unwritten = minute.unwritten if minute else 0
            if minute is None and len(self._callers) >= MAX_CALLERS:
                self._forget_before(now - WINDOW_S)
            minute = self._callers[caller] = _Minute(now, unwritten=unwritten)
        if minute.written >= self.per_minute:
            if minute.unwritten == 0:
                log.warning(
                    "Over %d refusals of %s this minute: the rest are counted, not written "
                    "(c.AuditTrail.denials_per_minute)",
                    self.per_minute,
                    caller,
                )
            minute.unwritten += 1
            return None
        minute.written += 1
        unwritten, minute.unwritten = minute.unwritten, 0
        return unwritten

    def _forget_before(self, cutoff: float) -> None:
        # A caller forgotten with refusals unwritten loses only their count, which
        # the log's warning already gave.
        for caller in [c for c, m in self._callers.items() if m.start < cutoff]:
            del self._callers[caller]
