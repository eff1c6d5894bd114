"""The degrade-to-local-only state machine (docs/design.md §4.4): enters below 85% over the window, never
flaps around the boundary (the exit threshold, the hold, the dwell), waits for enough lookups and a whole
window, recovers after the hold, and accounts the time spent local-only; and its wiring in the tiered cache
(the peers' L2 skipped while local-only)."""

from __future__ import annotations

import pytest

from services.tiers.entry import encode_text
from services.tiers.node.degrade import DegradeConfig, HitRateGuard, ModeChange
from tests.unit.tiers.fakes import Clock, FakePeers
from tests.unit.tiers.test_tiered import make, meta, stored

# Small numbers keep the tables readable: a 1 s window, ticks of 100 ms.
CFG = DegradeConfig(
    window_ms=1_000, enter_below=0.85, exit_at=0.90, hold_ms=300, min_dwell_ms=0, min_lookups=50
)


def run(
    guard: HitRateGuard, clock: Clock, ticks: list[tuple[int, int]], every_ms: int = 100
) -> tuple[str, list[ModeChange]]:
    """Feed `(hits, lookups)` per tick, one tick every `every_ms`; the modes seen (n: normal, L: local
    only, one letter per tick) and the changes."""
    modes, changes = [], []
    for hits, lookups in ticks:
        clock.advance(every_ms)
        change = guard.observe(hits, lookups)
        if change is not None:
            changes.append(change)
        modes.append("L" if guard.local_only else "n")
    return "".join(modes), changes


def rate(per_tick_rate: float, ticks: int, lookups: int = 20) -> list[tuple[int, int]]:
    return [(round(per_tick_rate * lookups), lookups)] * ticks


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        # A steady 95%: never leaves normal.
        (rate(0.95, 30), "n" * 30),
        # 80% from the start: local-only once a whole window (10 ticks) has been watched.
        (rate(0.80, 15), "n" * 9 + "L" * 6),
        # Exactly 85% is not below 85%.
        (rate(0.85, 20), "n" * 20),
        # 95% then 50%: the window's rate (90.5%, 86%, 81.5%) falls under 85% three ticks after the drop.
        (rate(0.95, 10) + rate(0.50, 5), "n" * 12 + "LLL"),
    ],
)
def test_enters_local_only_below_the_threshold(ticks: list[tuple[int, int]], expected: str) -> None:
    clock = Clock()
    modes, _ = run(HitRateGuard(CFG, clock=clock), clock, ticks)
    assert modes == expected


def test_the_change_says_why_with_the_window_hit_rate_and_the_lookups() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    _, [change] = run(guard, clock, rate(0.5, 10))
    assert (change.mode, change.previous, change.changes) == ("local_only", "normal", 1)
    assert change.lookups == 200 and change.hits == 100 and change.hit_rate == pytest.approx(0.5)
    assert "50.0%" in change.reason and "< 85%" in change.reason and "200 lookups" in change.reason
    assert guard.stats().reason == change.reason


@pytest.mark.parametrize(
    ("lookups_per_tick", "enters"),
    [(4, False), (5, True)],  # 10 ticks in the window: 40 lookups < min_lookups 50 <= 50
)
def test_min_lookups_guard_keeps_a_quiet_node_normal(lookups_per_tick: int, enters: bool) -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    run(guard, clock, [(0, lookups_per_tick)] * 40)
    assert guard.local_only is enters
    if not enters:
        assert guard.stats().window_lookups == 40 and guard.stats().window_hit_rate == 0.0


def test_no_decision_before_a_whole_window_was_watched() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    modes, _ = run(guard, clock, [(0, 500)] * 12)  # plenty of lookups from the first tick
    assert modes == "n" * 9 + "LLL"  # the 10th tick closes the first whole window


def test_never_flaps_around_the_boundary() -> None:
    """A rate wandering between 85% and 90% per tick (87.5% over the window) changes nothing: it does
    not take a normal node down (not below 85%), nor bring a local-only one back (not 90%)."""
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    wander = [(17, 20), (18, 20)] * 20
    modes, changes = run(guard, clock, wander)
    assert modes == "n" * 40 and not changes
    run(guard, clock, rate(0.5, 10))
    assert guard.local_only
    modes, changes = run(guard, clock, wander)
    assert modes == "L" * 40 and not changes


def test_recovers_only_after_the_rate_held_at_exit_for_the_hold() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    run(guard, clock, rate(0.5, 10))
    assert guard.local_only
    # All hits: the window's rate climbs as the 50% ticks age out and reaches 90% at the 8th tick;
    # the hold (300 ms, three ticks) ends at the 11th.
    modes, changes = run(guard, clock, rate(1.0, 15))
    assert modes == "L" * 10 + "n" * 5
    [back] = changes
    assert (back.mode, back.previous) == ("normal", "local_only")
    assert back.hit_rate == 1.0 and "held for 300 ms" in back.reason and ">= 90%" in back.reason


def test_a_dip_during_the_hold_starts_it_again() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    run(guard, clock, rate(0.0, 10))
    run(guard, clock, rate(1.0, 9))  # 90% at the 9th tick: the hold starts
    assert guard.local_only and guard.stats().holding_ms == 0
    run(guard, clock, [(0, 40)])  # a bad tick: 180 hits in 220 lookups
    assert guard.stats().holding_ms is None
    # The bad tick stays in the window for nine more ticks, then the hold runs its three again.
    modes, _ = run(guard, clock, rate(1.0, 15))
    assert modes == "L" * 12 + "n" * 3


def test_min_dwell_holds_a_mode_even_when_the_rate_says_otherwise() -> None:
    clock = Clock()
    cfg = DegradeConfig(window_ms=1_000, hold_ms=0, min_dwell_ms=2_000, min_lookups=50)
    guard = HitRateGuard(cfg, clock=clock)
    modes, _ = run(guard, clock, rate(0.0, 10) + rate(1.0, 25))
    entered = modes.index("L")
    # The window was all hits ten ticks after the change; the dwell (20 ticks) kept it local-only.
    assert modes.index("n", entered) - entered == 20
    # And straight back down: below 85% two ticks on, but normal until the dwell ends, 20 ticks after
    # the change (the 30th of the 35 above): at this run's 15th.
    modes, _ = run(guard, clock, rate(0.0, 25))
    assert modes.index("L") == 14


def test_quiet_while_local_only_restarts_the_hold() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    run(guard, clock, rate(0.0, 10))
    run(guard, clock, [(2, 2)] * 30)  # all hits, but 20 lookups a window: no evidence
    assert guard.local_only and guard.stats().holding_ms is None


def test_time_spent_local_only_is_accounted() -> None:
    clock = Clock()
    guard = HitRateGuard(CFG, clock=clock)
    run(guard, clock, rate(0.0, 10))  # local-only at the 10th tick
    assert guard.local_only and guard.local_only_ms() == 0
    clock.advance(250)
    assert guard.local_only_ms() == 250 and guard.stats().in_mode_ms == 250
    _, [back] = run(guard, clock, rate(1.0, 15))
    spent = back.in_previous_ms
    assert back.local_only_ms == spent == 1_350
    clock.advance(5_000)
    assert guard.local_only_ms() == spent  # not counting while normal
    _, [down] = run(guard, clock, rate(0.0, 10))
    assert down.local_only_ms == spent and down.in_previous_ms > 5_000
    clock.advance(100)
    assert guard.local_only_ms() == spent + clock() - down.at_ms
    assert guard.stats().changes == 3


@pytest.mark.parametrize(
    "kwargs",
    [{"enter_below": 0.9, "exit_at": 0.85}, {"window_ms": 0}, {"min_lookups": 0}, {"hold_ms": -1}],
)
def test_config_refuses_what_cannot_work(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DegradeConfig(**kwargs)  # type: ignore[arg-type]


def test_observe_refuses_impossible_counts() -> None:
    guard = HitRateGuard(CFG, clock=Clock())
    with pytest.raises(ValueError):
        guard.observe(3, 2)


async def test_a_local_only_node_stops_asking_peers_and_comes_back() -> None:
    """The wiring in the tiered cache: the guard is fed on `check_mode` ticks; while local-only the
    peers' L2 is skipped (counted) and L3 still answers; back in normal the peers are asked again."""
    rig = make()
    cache, clock = rig.cache, rig.clock
    cache.placement.degrade = HitRateGuard(CFG, clock=clock)
    peers = FakePeers({"p": stored("p", "from a peer", clock)})
    cache.placement.peers = peers
    rig.l3.rows["in-l3"] = stored("in-l3", "from l3", clock)
    changes = []
    for i in range(10):
        for j in range(10):
            await cache.get(f"absent-{i}-{j}")
        clock.advance(100)
        changes.append(cache.check_mode())
    assert [c.mode for c in changes if c is not None] == ["local_only"]
    assert cache.mode == "local_only" and len(peers.asked) == 100
    hit = await cache.get("in-l3")
    assert (hit.tier, hit.degraded) == ("l3", False), "L3 still serves; not the breaker's degraded"
    assert not (await cache.get("p")).hit and len(peers.asked) == 100
    stats = cache.stats()
    assert stats["mode"] == "local_only" and stats["local_only"]["peers_skipped"] == 2
    assert stats["local_only"]["window_hit_rate"] == 0.0 and stats["local_only"]["changes"] == 1
    await cache.put(meta("hot"), encode_text("hot", model="m"))
    for _ in range(15):
        for _ in range(20):
            await cache.get("hot")
        clock.advance(100)
        if (change := cache.check_mode()) is not None:
            changes.append(change)
    assert cache.mode == "normal" and changes[-1] is not None and changes[-1].mode == "normal"
    assert (await cache.get("p")).remote and len(peers.asked) == 101
    assert cache.stats()["local_only"]["local_only_ms"] == changes[-1].local_only_ms > 0


def test_without_a_guard_the_mode_stays_normal() -> None:
    rig = make()
    assert rig.cache.check_mode() is None and rig.cache.mode == "normal"
    expected = {"enabled": False, "off_because": "disabled", "peers_skipped": 0}
    assert rig.cache.stats()["local_only"] == expected


async def test_a_node_without_peers_stays_normal_and_says_why() -> None:
    # Local-only skips the peers' L2: a lone node's low hit rate has nothing to fall back from.
    rig = make()
    rig.cache.placement.degrade = HitRateGuard(CFG, clock=rig.clock)
    for i in range(10):
        for j in range(10):
            await rig.cache.get(f"absent-{i}-{j}")
        rig.clock.advance(100)
        assert rig.cache.check_mode() is None
    assert rig.cache.mode == "normal"
    local = rig.cache.stats()["local_only"]
    assert (local["enabled"], local["off_because"]) == (False, "no peers to skip")
