"""The bytes of endpoint calls the service holds at once, per caller and in all.

An OIP v2 call's body (up to 256 MiB) is read whole before it is forwarded, and the
replica's answer (up to 256 MiB) is read whole before it is sent on. Nothing else
bounded how many of them one caller kept in the service's memory at once: six
concurrent 200 MiB answers added 1.9 GiB, and bodies waiting for a cold start (up to
the version's ``max_queue`` of them) were held all the while. So every byte of a
call's body, from when it is read until the call is answered, and every byte of its
answer, from when it is read until it is written to the caller, counts here:

- one caller (a hub user or service) may hold :data:`CALL_BYTES_PER_CALLER`;
- all callers together :data:`CALL_BYTES_TOTAL`.

A call that would pass either is refused with :class:`NoRoom` (a 429 with
``Retry-After``): its body before it is read where its ``Content-Length`` says so,
else as the bytes come. One call alone always fits its caller's share (a body and an
answer at their caps are 512 MiB). The REST API's routes hold their bodies to the
same share per caller (:mod:`gpulab.service.api.request_body`); this is the endpoint
calls' own count, kept by the call path (:class:`~.calls.EndpointCalls`), so the
router, the service's own endpoint route and the standby router each count theirs.
"""

from __future__ import annotations

from collections import Counter

#: What one caller's endpoint calls may hold in the service's memory at once: a body
#: and an answer at their caps (256 MiB each), or many smaller calls.
CALL_BYTES_PER_CALLER = 512 << 20
#: What every caller's endpoint calls together may hold.
CALL_BYTES_TOTAL = 2 << 30
#: When a refused caller is told to try again: calls of that size take seconds.
RETRY_AFTER_S = 2


def _mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB"


class NoRoom(Exception):
    """A call whose bytes would pass what the service holds of calls: a 429."""

    status = 429

    def __init__(self, message: str):
        super().__init__(message)
        self.retry_after = RETRY_AFTER_S


class CallBytes:
    """Who holds how many bytes of endpoint calls now (:meth:`hold` per call)."""

    def __init__(self, per_caller: int = CALL_BYTES_PER_CALLER, total: int = CALL_BYTES_TOTAL):
        self.per_caller = per_caller
        self.total = total
        self.held: Counter[str] = Counter()
        self.in_all = 0

    def hold(self, caller: str) -> Held:
        """A new call's bytes, counted against ``caller`` until :meth:`Held.release`."""
        return Held(self, caller)

    def _take(self, caller: str, n: int, mine: int) -> None:
        if n <= 0:
            return
        others = self.held[caller] - mine  # the caller's other calls
        if others and self.held[caller] + n > self.per_caller:
            raise NoRoom(
                f"your endpoint calls already hold {_mib(others)} in gpulab's memory "
                f"(bodies not yet answered, answers not yet read by you), and this one "
                f"would pass the {_mib(self.per_caller)} one caller may hold at once: "
                f"wait for those to be answered, then send it again"
            )
        if self.in_all + n > self.total:
            raise NoRoom(
                f"gpulab holds {_mib(self.in_all)} of endpoint calls now, the most it "
                f"holds is {_mib(self.total)}: send it again shortly"
            )
        self.held[caller] += n
        self.in_all += n

    def _give(self, caller: str, n: int) -> None:
        if n <= 0:
            return
        self.held[caller] -= n
        self.in_all -= n
        if self.held[caller] <= 0:
            del self.held[caller]


class Held:
    """The bytes one call holds: :meth:`add` as they are read, all given back by
    :meth:`release` (once; again does nothing)."""

    def __init__(self, budget: CallBytes, caller: str):
        self.budget = budget
        self.caller = caller
        self.bytes = 0
        #: Released: the call was answered or given up (its caller went away while
        #: the replica worked); what it reads after that is counted nowhere, so
        #: nothing may be added to it (it would stay counted for good).
        self.closed = False

    def add(self, n: int) -> None:
        """Count ``n`` more bytes; NoRoom (nothing counted) past the caller's share or
        the service's, or once the call was released."""
        if self.closed:
            raise NoRoom("the call was given up: its caller went away")
        self.budget._take(self.caller, n, self.bytes)
        self.bytes += n

    def drop(self, n: int) -> None:
        """Give back ``n`` of the bytes counted (a body no longer held)."""
        n = min(n, self.bytes)
        self.bytes -= n
        self.budget._give(self.caller, n)

    def release(self) -> None:
        self.closed = True
        held, self.bytes = self.bytes, 0
        self.budget._give(self.caller, held)
