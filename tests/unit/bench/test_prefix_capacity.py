"""`bench.prefix_capacity`: the bisection finds the least capacity that reaches a target hit rate."""

from __future__ import annotations

from pathlib import Path

from bench.prefix_capacity import RESOLUTION, capacity_to_match, hit_rate


def test_bisection_finds_the_least_capacity_reaching_the_target(tmp_path: Path) -> None:
    # A loop over 50 keys: LRU hits nothing below 50 entries and everything (after the first
    # lap) at 50, so the least capacity reaching LRU's rate at 60 is 50.
    path = tmp_path / "loop.trace"
    path.write_text("\n".join(str(k % 50) for k in range(2_000)) + "\n")
    target = hit_rate(str(path), "lru", 60, 0)
    need, rate, probes = capacity_to_match(str(path), "lru", 60, target, 0)
    assert need is not None and rate is not None and rate >= target
    assert 50 <= need <= 50 + max(1, round(RESOLUTION * 60))
    assert all(r < target for c, r in probes if c < 50)


def test_an_unreachable_target_is_reported_as_none(tmp_path: Path) -> None:
    path = tmp_path / "loop.trace"
    path.write_text("\n".join(str(k % 50) for k in range(2_000)) + "\n")
    need, rate, _ = capacity_to_match(str(path), "lru", 10, 0.99, 0)
    assert need is None and rate is None
