"""Tokens through the OpenAI-compatible gateway: limits per user, accounting, metrics.

Limits (``c.LlmSettings.llm_max_streams_per_user`` and
``llm_tokens_per_minute_per_user``, 0 = none; a member of a group in the
``..._per_group`` settings gets the most generous of their groups' values):

- streams: generation calls (chat and completions, streamed or not) a user has in
  flight at once. A slot is held from the call's admission to its end, whatever
  ends it (the answer's last byte, an error, the caller going away).
- tokens per minute: prompt and completion tokens a user's calls used in the last
  60 s. A call is admitted while the user is under the limit; what it uses counts
  when it ends (like LiteLLM's and OpenAI's own TPM limits, one call may overshoot).

Over a limit: 429 in OpenAI's shape with ``Retry-After``. Each call's tokens go to
the database (:mod:`gpulab.db.llm_usage`, ``GET /usage?unit=tokens``) and to
Prometheus (``gpulab_llm_tokens_total``, time to first token and inter-token
latency), by deployment id as the endpoint series are (no user names in labels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter, Histogram

from gpulab.db import clock as db_clock
from gpulab.service.endpoints.openai_errors import OpenAIError

log = logging.getLogger("gpulab.service.endpoints.token_meter")

WINDOW_S = 60.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class LlmLimits:
    """The limits' settings: a default per user and, per group, an override."""

    max_streams: int = 0
    tokens_per_minute: int = 0
    group_max_streams: Mapping[str, int] = field(default_factory=dict)
    group_tokens_per_minute: Mapping[str, int] = field(default_factory=dict)

    @staticmethod
    def _of(default: int, by_group: Mapping[str, int], groups) -> int:
        """The most generous value of the user's groups that have one (0 = no limit
        beats any number), else the default."""
        values = [int(by_group[g]) for g in groups if g in by_group]
        if not values:
            return default
        return 0 if 0 in values else max(values)

    def streams_for(self, who) -> int:
        return self._of(self.max_streams, self.group_max_streams, who.groups)

    def tokens_for(self, who) -> int:
        return self._of(self.tokens_per_minute, self.group_tokens_per_minute, who.groups)


class TokenMeter:
    """Admits calls under the limits and counts what they use. ``store`` (a
    ``TokenUsageStore``) keeps one row a call, written on ``threads`` (the service's
    ``DbThreads``, off the event loop) by one writer, many rows a transaction, however
    fast calls come; without them nothing is written."""

    def __init__(
        self,
        limits: LlmLimits,
        store=None,
        threads=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limits = limits
        self.store = store
        self.threads = threads
        self.clock = clock
        self.streams: dict[str, int] = {}
        self._used: dict[str, deque[tuple[float, int]]] = {}
        #: deployment id -> (when, completion tokens) of its calls in the last minute.
        self._generated: dict[str, deque[tuple[float, int]]] = {}
        #: Rows not written yet, and the one task writing them.
        self._rows: list[dict] = []
        self._writer: asyncio.Task | None = None
        self.tokens = Counter(
            "gpulab_llm_tokens",
            "Prompt and completion tokens of the calls through the OpenAI gateway.",
            ["deployment", "version", "type"],
            registry=None,
        )
        self.ttft = Histogram(
            "gpulab_llm_time_to_first_token_seconds",
            "From a streamed call's arrival at the gateway to its first token.",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.itl = Histogram(
            "gpulab_llm_inter_token_latency_seconds",
            "Between two tokens of a streamed answer, at the gateway.",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )

    def register(self, registry) -> None:
        for metric in (self.tokens, self.ttft, self.itl):
            registry.register(metric)

    # -- limits --------------------------------------------------------------------------
    def _trim(self, window: deque) -> None:
        """Drop what is older than the window (each count trims: a user who never
        meets a limit keeps one minute of calls, not all of them)."""
        horizon = self.clock() - WINDOW_S
        while window and window[0][0] <= horizon:
            window.popleft()

    def _in_window(self, window: deque | None) -> int:
        if not window:
            return 0
        self._trim(window)
        return sum(n for _, n in window)

    def used_last_minute(self, user: str) -> int:
        return self._in_window(self._used.get(user))

    def tokens_per_second(self, dep_id: str) -> float:
        """Completion tokens the endpoint generated per second, over the last minute."""
        return round(self._in_window(self._generated.get(dep_id)) / WINDOW_S, 2)

    def check_rate(self, who) -> None:
        """429 if ``who`` used their tokens of the last minute."""
        limit = self.limits.tokens_for(who)
        if not limit:
            return
        used = self.used_last_minute(who.name)
        if used < limit:
            return
        # Retry when enough of the window's tokens have aged out to be under the limit.
        over, wait = used - limit, WINDOW_S
        for t, n in self._used[who.name]:
            over -= n
            if over < 0:
                wait = t + WINDOW_S - self.clock()
                break
        raise OpenAIError(
            429,
            f"{who.name} used {used} tokens in the last minute, over the limit of {limit} "
            "(c.LlmSettings.llm_tokens_per_minute_per_user); retry after the Retry-After "
            "seconds",
            code="rate_limit_exceeded",
            retry_after=max(1, math.ceil(wait)),
        )

    @contextlib.contextmanager
    def stream_slot(self, who):
        """Hold one of ``who``'s streams for the ``with`` block; 429 if none is free."""
        limit = self.limits.streams_for(who)
        held = self.streams.get(who.name, 0)
        if limit and held >= limit:
            raise OpenAIError(
                429,
                f"{who.name} has {held} calls in flight, the most allowed "
                "(c.LlmSettings.llm_max_streams_per_user); retry when one ends",
                code="rate_limit_exceeded",
                retry_after=1,
            )
        self.streams[who.name] = held + 1
        try:
            yield
        finally:
            left = self.streams[who.name] - 1
            if left:
                self.streams[who.name] = left
            else:
                del self.streams[who.name]

    # -- accounting ----------------------------------------------------------------------
    def count(
        self, who, dep: dict, version: int, prompt: int, completion: int, adapter: str = ""
    ) -> None:
        """One call's tokens: against the caller's rate, in the metrics and the database
        (by ``adapter`` too, the LoRA adapter the call named; '' for the base model)."""
        prompt, completion = max(0, int(prompt)), max(0, int(completion))
        if prompt + completion:
            used = self._used.setdefault(who.name, deque())
            used.append((self.clock(), prompt + completion))
            self._trim(used)
        if completion:
            made = self._generated.setdefault(dep["id"], deque())
            made.append((self.clock(), completion))
            self._trim(made)
        labels = (dep["id"], str(version))
        self.tokens.labels(*labels, "prompt").inc(prompt)
        self.tokens.labels(*labels, "completion").inc(completion)
        if self.store is not None:
            self._rows.append(
                {
                    "at": db_clock.utcnow(),
                    "user": who.name,
                    "owner": dep["user"],
                    "endpoint": dep["name"],
                    "version": version,
                    "adapter": adapter,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                }
            )
            if self._writer is None or self._writer.done():
                self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        """Write the rows waiting, as many as came meanwhile in each transaction."""
        while self._rows:
            rows, self._rows = self._rows, []
            try:
                await self.threads.run(self.store.record_many, rows)
            except Exception as e:  # noqa: BLE001 - the next rows are still written
                log.error("Could not record LLM token use of %d calls: %s", len(rows), e)

    async def flush(self) -> None:
        """Wait for the rows being written (a clean stop; tests)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
