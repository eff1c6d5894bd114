"""Conversations: started once, ended by idling or explicitly, bounded; served answers by response id."""

from __future__ import annotations

from services.gateway.conversations import Conversations, Served, ServedAnswers


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def test_started_once_and_idle_ends() -> None:
    clock = Clock()
    c = Conversations(idle_ms=100, max_tracked=10, clock=clock)
    assert c.touch("a") is True
    clock.ms = 50
    assert c.touch("a") is False
    assert c.touch("b") is True
    clock.ms = 149
    assert c.idle() == []
    clock.ms = 150
    assert c.idle() == ["a", "b"]
    assert len(c) == 0
    assert c.touch("a") is True  # a new conversation under an old id starts again


def test_touch_keeps_it_alive() -> None:
    clock = Clock()
    c = Conversations(idle_ms=100, max_tracked=10, clock=clock)
    c.touch("a")
    c.touch("b")
    clock.ms = 90
    c.touch("a")
    clock.ms = 100
    assert c.idle() == ["b"]
    assert "a" in c


def test_explicit_end() -> None:
    c = Conversations(idle_ms=100, max_tracked=10, clock=Clock())
    c.touch("a")
    assert c.end("a") is True and c.end("a") is False and c.end("never") is False


def test_no_idle_timeout() -> None:
    clock = Clock()
    c = Conversations(idle_ms=0, max_tracked=10, clock=clock)
    c.touch("a")
    clock.ms = 10**9
    assert c.idle() == []


def test_bounded_forgets_the_oldest() -> None:
    c = Conversations(idle_ms=100, max_tracked=2, clock=Clock())
    for name in "abc":
        c.touch(name)
    assert "a" not in c and len(c) == 2 and c.forgotten == 1


def test_served_answers_bounded() -> None:
    served = ServedAnswers(2)
    for i in range(3):
        served.add(f"r{i}", Served(f"k{i}", "p", "exact"))
    assert served.get("r0") is None
    assert served.get("r2") == Served("k2", "p", "exact")
