"""The one way tests wait: poll a condition until it holds, within a bound.

A bound is not a timing claim: on a loaded 2-core machine things take long, and
the bound only keeps a broken test from hanging. On timeout the error says what
was awaited (and the last value seen, when there was one), never just "timed out".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: The default bound: generous for real hubs, servers and job ranks under load.
WAIT_S = 240.0


def wait_until(
    predicate: Callable[[], T],
    what: str,
    timeout: float = WAIT_S,
    every: float = 0.25,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.

    ``what`` says what is awaited ("alice's server ready"); ``detail`` may add
    context to the error (a log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what} (last: {value!r}){extra}"
            )
        time.sleep(every)


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    what: str,
    timeout: float = WAIT_S,
    every: float = 0.1,
) -> T:
    """:func:`wait_until` for tests on an event loop: it yields to the loop between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what} (last: {value!r})"
            )
        await asyncio.sleep(every)
