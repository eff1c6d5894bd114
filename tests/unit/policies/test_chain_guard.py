"""The guard of heat's learned chain term and its LRFU half-life (`policies/learned/guard.py`,
`heatcore/src/guard.rs`): the two implementations agree while it stands the term down and moves the
half-life, it wins back what the term and the short half-life lose on traffic unlike the dev trace, and it
leaves both as they are where they pay."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from policies.base import AccessMeta
from policies.learned.chains import ChainReuse
from policies.learned.compiled import CompiledHeat
from policies.learned.guard import MAX_MINIATURE, MIN_WINDOW, RATE, ChainGuard, root_sampled
from policies.learned.heat import HeatPolicy
from sim.generated import mixed_prefix_trace
from sim.replay import replay
from tests.unit.policies.test_heatcore import _mooncake, _step_by_step


def test_core_and_reference_agree_access_for_access_while_the_guard_acts() -> None:
    trace = mixed_prefix_trace(1, 3000)
    ours, theirs = CompiledHeat(2000), HeatPolicy(2000)
    got = _step_by_step(trace, ours, 10**9)
    want = _step_by_step(trace, theirs, 10**9)
    assert got == want
    assert ours.chain_guard is not None and theirs.chain_guard is not None
    mine, reference = ours.chain_guard.state(), theirs.chain_guard.state()
    assert mine == reference
    assert mine.windows_off > 0, "the term was stood down on this traffic"
    assert mine.switches >= 1 and mine.half_life != 3.0, "the half-life moved on this traffic"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_guard_wins_back_what_the_term_loses_on_mixed_traffic(seed: int) -> None:
    trace = mixed_prefix_trace(seed, 6000)
    guarded = replay(trace, CompiledHeat(2000)).hit_rate
    term = replay(trace, CompiledHeat(2000, chain_guard=False)).hit_rate
    without = replay(trace, CompiledHeat(2000, chain_reuse=False)).hit_rate
    assert without > term, "on this traffic the term costs hits"
    assert guarded - term > (without - term) / 2, "the guard wins back more than half of them"


def test_where_the_term_pays_the_guard_leaves_it_on() -> None:
    trace = _mooncake()
    policy = CompiledHeat(10_000)
    guarded = replay(trace, policy).hit_rate
    assert guarded > replay(trace, CompiledHeat(10_000, chain_reuse=False)).hit_rate
    assert policy.chain_guard is not None
    state = policy.chain_guard.state()
    assert state.windows > 10 and state.windows_off == 0
    assert state.switches == 0 and state.half_life == 3.0, "the half-life that pays here stays"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_longer_half_life_wins_on_mixed_traffic_and_the_guard_finds_it(seed: int) -> None:
    trace = mixed_prefix_trace(seed, 6000)
    policy = CompiledHeat(2000)
    moved = replay(trace, policy).hit_rate
    fixed = replay(trace, CompiledHeat(2000, chain_half_lives=[])).hit_rate
    assert policy.chain_guard is not None
    state = policy.chain_guard.state()
    assert state.half_life > 3.0
    assert moved > fixed * 1.1, "one-off documents no longer push out conversations"


def test_no_guard_without_the_term_or_below_a_useful_miniature() -> None:
    for policy in (
        HeatPolicy(10_000, chain_reuse=False),
        HeatPolicy(RATE * 63),
        HeatPolicy(10_000, chain_guard=False),
    ):
        policy.on_miss(1, 0)
        policy.on_miss(2, 0, meta=AccessMeta(parent=1))
        assert policy.chain_guard is None


def test_the_sample_is_the_miniature_s_share_of_the_chains() -> None:
    for capacity in (5_000, 200_000):
        policy = HeatPolicy(capacity)
        policy.on_miss(1, 0)
        policy.on_miss(2, 0, meta=AccessMeta(parent=1))
        guard = policy.chain_guard
        assert guard is not None
        share = min(capacity // RATE, MAX_MINIATURE) / capacity
        sampled = sum(root_sampled(k, guard.cut) for k in range(100_000)) / 100_000
        assert sampled == pytest.approx(share, rel=0.1)


class _Scripted:
    """A miniature that hits exactly the keys it is told to."""

    def __init__(self) -> None:
        self.hits: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.hits

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        pass

    def on_miss(self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None) -> Any:
        return []

    def set_half_life(self, half_life: float) -> None:
        self.half_life = half_life


def test_the_term_stands_down_on_evidence_and_comes_back_when_it_pays_again() -> None:
    reuse = ChainReuse(100, weight=0.5)
    with_term, without = _Scripted(), _Scripted()
    guard = ChainGuard(reuse, [without], [3.0], with_term, MIN_WINDOW, 0, _no_move)

    def window(with_hits: int, without_hits: int) -> None:
        with_term.hits = set(range(with_hits))
        without.hits = set(range(without_hits))
        for key in range(MIN_WINDOW):
            guard.heard(key, None, 0)

    for _ in range(3):
        window(10, 40)
    assert guard.term_on, "no decision before MIN_WINDOWS windows"
    window(10, 40)
    assert not guard.term_on and reuse.weight == 0.0
    assert reuse.bonus(False) == 0.0 and reuse.bonus(True) == 0.0
    for _ in range(8):
        window(60, 40)
    assert guard.term_on and reuse.weight == 0.5
    state = guard.state()
    assert state.windows == 12 and 1 <= state.windows_off < 8


def _no_move(half_life: float) -> None:
    raise AssertionError("one arm: nowhere to move")


def test_the_half_life_moves_on_evidence_to_the_arm_that_leads_by_most() -> None:
    reuse = ChainReuse(100, weight=0.5)
    arms, with_term = [_Scripted(), _Scripted(), _Scripted()], _Scripted()
    moves: list[float] = []
    guard = ChainGuard(reuse, arms, [3.0, 10.0, 30.0], with_term, MIN_WINDOW, 0, moves.append)

    def window(*hits: int) -> None:
        for arm, n in zip(arms, hits, strict=True):
            arm.hits = set(range(n))
        with_term.hits = set(range(hits[guard.current]))  # the term neither helps nor hurts
        for key in range(MIN_WINDOW):
            guard.heard(key, None, 0)

    for n in range(8):
        window(40, 38 + 4 * (n % 2), 40)  # arm 10 leads no more than it trails: noise
    assert moves == []
    for _ in range(4):
        window(40, 50, 60)
    assert moves == [30.0] and guard.current == 2
    assert with_term.half_life == 30.0, "the miniature with the term follows"
    assert guard.term_on, "the term is judged on the arm in use"
    state = guard.state()
    assert state.half_life == 30.0 and state.switches == 1
