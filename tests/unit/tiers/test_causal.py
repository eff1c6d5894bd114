"""The causal clock: wall time, but never behind what was heard from elsewhere; stamps too far ahead are
not believed."""

from __future__ import annotations

from services.tiers.node.causal import CausalClock


def test_wall_time_until_a_stamp_from_ahead_is_seen_then_one_past_it() -> None:
    wall = [1_000]
    clock = CausalClock(lambda: wall[0])
    assert clock.now() == 1_000
    clock.observe(900)  # from behind: changes nothing
    assert clock.now() == 1_000
    clock.observe(6_000)  # a node 5 s ahead
    assert clock.now() == 6_001 and clock.now() == 6_001  # no drift of its own
    wall[0] = 7_000  # once the wall clock passes it, wall time again
    assert clock.now() == 7_000


def test_a_stamp_too_far_ahead_is_refused() -> None:
    clock = CausalClock(lambda: 1_000, max_ahead_ms=60_000)
    clock.observe(1_000 + 3_600_000)
    clock.observe(None)
    assert clock.now() == 1_000 and clock.refused == 1
