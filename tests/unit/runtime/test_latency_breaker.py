"""The L3 circuit breaker (docs/design.md §4.4): opens when the window's P99 passes the bound, refuses
calls while open, lets one probe through after the cooldown and closes only on a fast, successful probe."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.breaker import LatencyBreaker
from tests.unit.tiers.fakes import Clock


def breaker(clock: Clock) -> LatencyBreaker:
    return LatencyBreaker(p99_ms=150, window=100, min_calls=10, cooldown_ms=5000, clock=clock)


def test_stays_closed_while_p99_is_under_the_bound() -> None:
    b = breaker(Clock())
    for _ in range(200):
        assert b.allow()
        b.record(20.0)
    b.record(149.0)
    assert b.state == "closed"


def test_waits_for_min_calls_then_opens_on_a_slow_tail() -> None:
    b = breaker(Clock())
    for _ in range(9):
        b.record(500.0)
    assert b.state == "closed"
    b.record(500.0)
    assert b.state == "open" and b.opened == 1 and "p99" in (b.reason or "")
    assert not b.allow() and b.rejected == 1


def test_a_few_slow_calls_in_many_fast_ones_trip_it_at_p99() -> None:
    b = breaker(Clock())
    for _ in range(97):
        b.record(10.0)
    for _ in range(3):
        b.record(400.0)
    assert b.state == "open"


@pytest.mark.parametrize(
    ("probe_ms", "ok", "closes"), [(20.0, True, True), (300.0, True, False), (5.0, False, False)]
)
def test_half_open_probe(probe_ms: float, ok: bool, closes: bool) -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(10):
        b.record(1000.0)
    clock.advance(4999)
    assert not b.allow()
    clock.advance(1)
    assert b.allow() and b.state == "half_open"
    assert not b.allow()  # one probe at a time
    b.record(probe_ms, ok=ok)
    assert b.state == ("closed" if closes else "open")
    if closes:
        assert b.allow() and b.stats().calls_in_window == 1


def test_failures_count_as_slow() -> None:
    b = breaker(Clock())
    for _ in range(10):
        b.record(1.0, ok=False)
    assert b.state == "open" and b.failures == 10


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 400), st.booleans(), st.integers(0, 3000)), max_size=400))
def test_it_opens_exactly_when_the_window_p99_says_so(calls: list[tuple[float, bool, int]]) -> None:
    """The count of slow samples that spares the percentile changes no decision: a reference that
    computes the window's P99 on every call agrees, call by call."""
    clock = Clock()
    b = LatencyBreaker(p99_ms=150, window=30, min_calls=10, cooldown_ms=2000, clock=clock)
    window: deque[float] = deque(maxlen=30)
    state = "closed"
    for latency, ok, wait_ms in calls:
        clock.advance(wait_ms)
        before = b.state
        if not b.allow():
            continue
        b.record(latency, ok)
        slow = latency if ok else max(latency, 300.0)
        if before != "closed":  # half-open: the probe decides; the window restarts when it closes
            state = "closed" if ok and slow <= 150 else "open"
            if state == "closed":
                window.clear()
                window.append(slow)
        else:
            window.append(slow)
            if len(window) >= 10 and float(np.percentile(list(window), 99)) > 150:
                state = "open"
        assert b.state == state


def test_a_breaker_open_for_slowness_still_lets_a_waited_for_call_through_not_one_that_fails() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(10):
        b.record(500.0)
    assert b.state == "open" and not b.failing
    assert not b.allow() and b.allow_slow()  # a lookup is refused, a durable write is not
    b.record_slow(400.0, ok=True)
    assert b.state == "open" and b.allow_slow()  # a slow success changes nothing
    b.record_slow(1000.0, ok=False)
    assert b.state == "open" and b.failing and not b.allow_slow() and b.failures == 1
    clock.advance(5000)
    assert b.allow()  # the probe, fast: closed and no longer failing
    b.record(5.0)
    assert b.state == "closed" and not b.failing and b.allow_slow()


def test_a_window_with_failures_opens_failing() -> None:
    b = breaker(Clock())
    for _ in range(9):
        b.record(5.0)
    b.record(5.0, ok=False)  # one failure is slow enough to push the p99 over the bound
    assert b.state == "open" and b.failing and not b.allow_slow()
