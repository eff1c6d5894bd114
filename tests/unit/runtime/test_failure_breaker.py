"""The upstream's failure breaker: opens on a share of failures or a run of them, rejects while open,
one probe at a time half-open, closes on a good probe."""

from __future__ import annotations

import pytest

from services.runtime.breaker import FailureBreaker


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def breaker(clock: Clock, **kw: object) -> FailureBreaker:
    settings: dict[str, object] = {
        "failure_ratio": 0.5,
        "consecutive": 3,
        "window": 10,
        "min_calls": 4,
        "cooldown_ms": 1000,
    }
    return FailureBreaker(clock=clock, **{**settings, **kw})  # type: ignore[arg-type]


def test_opens_on_consecutive_failures() -> None:
    clock = Clock()
    b = breaker(clock)
    for ok in (True, False, False):
        assert b.allow()
        b.record(ok)
    assert b.state == "closed"
    b.record(False)
    assert b.state == "open" and b.reason == "3 failures in a row"
    assert not b.allow() and b.rejected == 1
    assert b.retry_after_ms() == 1000


def test_opens_on_failure_share() -> None:
    b = breaker(Clock(), consecutive=100)
    for ok in (True, True, False, True, False):
        b.record(ok)
    assert b.state == "closed"  # 2 of 5 is under half
    b.record(False)
    assert b.state == "open"
    assert b.reason == "3 of the last 6 calls failed"


def test_share_needs_min_calls() -> None:
    b = breaker(Clock(), consecutive=100, min_calls=4)
    for ok in (False, True, False):
        b.record(ok)
    assert b.state == "closed"


def test_successes_keep_it_closed() -> None:
    b = breaker(Clock())
    for _ in range(100):
        b.record(True)
    assert b.state == "closed" and b.stats().calls_in_window == 10


@pytest.mark.parametrize(("probe_ok", "state"), [(True, "closed"), (False, "open")])
def test_half_open_single_probe(probe_ok: bool, state: str) -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(False)
    clock.ms = 999
    assert not b.allow()
    clock.ms = 1000
    assert b.allow() and b.state == "half_open"
    assert not b.allow()  # the probe is out
    b.record(probe_ok)
    assert b.state == state
    if state == "open":
        assert b.reason == "probe failed" and b.opened == 2
        assert not b.allow()
    else:
        assert b.reason is None and b.allow() and b.stats().calls_in_window == 0


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        FailureBreaker(failure_ratio=0, clock=Clock())
    with pytest.raises(ValueError):
        FailureBreaker(window=2, min_calls=5, clock=Clock())


def test_an_abandoned_probe_lets_the_next_one_go() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(False)
    clock.ms = 1000
    assert b.allow() and not b.allow()
    b.abandon()  # the caller cancelled it: no verdict
    assert b.state == "half_open" and b.allow()
    b.abandon()
    closed = breaker(clock)
    closed.abandon()
    assert closed.state == "closed" and closed.allow()


def test_available_asks_without_taking_the_probe() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.allow()
        b.record(False)
    assert not b.available()
    clock.ms = 1000
    # Asked any number of times (routing looks at every instance, health reads it): the probe stays.
    assert b.available() and b.available()
    assert b.allow() and b.state == "half_open"
    assert not b.available() and not b.allow()
    b.record(True)
    assert b.state == "closed" and b.available()
