"""The OpenAI gateway's limits per user (:mod:`gpulab.service.endpoints.token_meter`),
on a clock the test moves: tokens per minute age out of the window, Retry-After says
when enough have, a group's value replaces the default, a slot frees however its
call ends."""

from __future__ import annotations

import pytest

from gpulab.service.auth import Identity
from gpulab.service.endpoints.openai_errors import OpenAIError
from gpulab.service.endpoints.token_meter import LlmLimits, TokenMeter

DEP = {"id": "d1", "user": "alice", "name": "chat"}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tokens_age_out_and_retry_after_says_when():
    clock = Clock()
    meter = TokenMeter(LlmLimits(tokens_per_minute=100), clock=clock)
    bob = Identity("bob", "user")
    meter.count(bob, DEP, 1, 30, 30)  # t=1000: 60
    clock.now += 20
    meter.count(bob, DEP, 1, 20, 30)  # t=1020: 50, 110 in the window
    with pytest.raises(OpenAIError) as e:
        meter.check_rate(bob)
    assert e.value.status == 429 and "110 tokens" in str(e.value)
    # Under the limit once the first call's 60 leave the window, at t=1060: 40 s on.
    assert e.value.retry_after == 40
    assert e.value.headers()["Retry-After"] == "40"
    clock.now = 1060.0
    meter.check_rate(bob)  # 50 left: admitted
    assert meter.tokens_per_second("d1") == round(30 / 60, 2)


def test_a_groups_value_replaces_the_default_and_the_most_generous_wins():
    limits = LlmLimits(
        max_streams=1,
        tokens_per_minute=100,
        group_max_streams={"a": 2, "b": 5},
        group_tokens_per_minute={"a": 1000, "vip": 0},
    )
    assert limits.streams_for(Identity("x", "user")) == 1
    assert limits.streams_for(Identity("x", "user", groups=frozenset({"a", "b"}))) == 5
    assert limits.tokens_for(Identity("x", "user", groups=frozenset({"a"}))) == 1000
    assert limits.tokens_for(Identity("x", "user", groups=frozenset({"a", "vip"}))) == 0


def test_a_slot_frees_however_its_call_ends():
    meter = TokenMeter(LlmLimits(max_streams=1))
    bob = Identity("bob", "user")
    with meter.stream_slot(bob):
        with pytest.raises(OpenAIError) as e, meter.stream_slot(bob):
            pass
        assert e.value.status == 429 and e.value.retry_after == 1
        with meter.stream_slot(Identity("carol", "user")):  # another user's are theirs
            pass
    with pytest.raises(ConnectionResetError), meter.stream_slot(bob):
        raise ConnectionResetError  # the caller went away
    assert meter.streams == {}


def test_a_users_window_keeps_one_minute_of_calls_without_a_limit():
    """Without a token limit the rate is never checked: counting trims the window
    itself (it grew by one entry a call for good)."""
    clock = Clock()
    meter = TokenMeter(LlmLimits(), clock=clock)
    bob = Identity("bob", "user")
    for _ in range(1000):
        meter.count(bob, DEP, 1, 1, 1)
        clock.now += 1
    assert len(meter._used["bob"]) <= 61 and len(meter._generated["d1"]) <= 61
