"""The turn-aware GPU-tier retention: ended conversations first, the farthest next turn next, LRU
for blocks of no conversation."""

from __future__ import annotations

import random

from policies.base import AccessMeta
from policies.recency.lru import LRU
from services.warmup.retention import LruGuarded, TurnAwareRetention


def turn(p: TurnAwareRetention, trace: str, blocks: list[str], at: int) -> list[str]:
    """One request of `trace` reading `blocks`; returns what left."""
    out: list[str] = []
    meta = AccessMeta(trace_id=trace)
    for b in blocks:
        if b in p:
            p.on_hit(b, at, meta)
        else:
            out += [str(e.key) for e in p.on_miss(b, at, 1, meta)]
    return out


def learn_gaps(p: TurnAwareRetention, gap_ms: int, n: int = 10, start: int = 0) -> int:
    """Conversations `learn-i` with two turns `gap_ms` apart (they then end); returns the time after."""
    at = start
    for i in range(n):
        turn(p, f"learn-{i}", [f"l{i}"], at)
        turn(p, f"learn-{i}", [f"l{i}"], at + gap_ms)
        p.ended(f"learn-{i}")
        at += 10
    return at + gap_ms


def test_an_ended_conversations_blocks_leave_first() -> None:
    p = TurnAwareRetention(4)
    turn(p, "a", ["a0", "a1"], 0)
    turn(p, "b", ["b0", "b1"], 10)
    p.ended("b")  # b was served last: LRU would evict a's blocks
    assert turn(p, "c", ["c0", "c1"], 20) == ["b1", "b0"]  # deepest first


def test_with_regular_pauses_the_conversation_just_served_leaves_before_one_about_to_return() -> None:
    p = TurnAwareRetention(20)
    now = learn_gaps(p, 10_000)  # every pause has been 10 s; the learners' 10 blocks are ended
    turn(p, "soon", ["s0", "s1"], now)  # back in ~10 s from `now`
    turn(p, "just", ["j0", "j1"], now + 8_000)  # back in ~10 s from now + 8 s
    for i in range(4):
        turn(p, f"fill-{i}", [f"f{i}"], now + 8_000)
    left = turn(p, "new", [f"n{i}" for i in range(14)], now + 8_000)
    assert left[:10] == [f"l{i}" for i in range(9, -1, -1)]  # ended first
    # then the farthest next turn: those served at now + 8 s (fill-*, just, new), never `soon`
    assert "s0" not in left and "s1" not in left


def test_a_conversation_at_a_turn_count_where_others_stopped_leaves_first() -> None:
    p = TurnAwareRetention(30)
    now = learn_gaps(p, 5_000)  # ten conversations, each ended after its 2nd turn
    assert p.goes_on(2) < 0.2 < p.goes_on(1)
    turn(p, "second", ["x0"], now)
    turn(p, "second", ["x0"], now + 5_000)  # its 2nd turn: most stop here
    turn(p, "first", ["y0"], now + 5_000)  # its 1st turn: every one went on
    for i in range(18):
        turn(p, "filler", [f"f{i}"], now + 5_000)
    left = turn(p, "new", ["n0"], now + 6_000)
    assert left == ["l9"]  # the ended ones still go first
    left = turn(p, "new", [f"n{i}" for i in range(1, 12)], now + 6_000)  # 9 learners, then 2
    assert "x0" in left and "y0" not in left


def test_blocks_of_no_conversation_follow_lru() -> None:
    rng = random.Random(0)
    p, lru = TurnAwareRetention(16), LRU(16)
    for t in range(2_000):
        key = rng.randrange(40)
        for policy in (p, lru):
            if key in policy:
                policy.on_hit(key, t)
            else:
                policy.on_miss(key, t)
        assert {k for k in range(40) if k in p} == {k for k in range(40) if k in lru}


def test_a_turn_after_the_end_signal_brings_the_conversation_back() -> None:
    p = TurnAwareRetention(4)
    turn(p, "a", ["a0"], 0)
    p.ended("a")
    turn(p, "a", ["a0", "a1"], 5_000)
    turn(p, "b", ["b0"], 5_010)
    assert p.next_use_in_ms("a", 5_010) < float("inf")


def test_the_guard_is_lru_on_blocks_of_no_conversation() -> None:
    # Blocks of no conversation: both shadows are LRU, and so is the guarded resident set.
    rng = random.Random(1)
    g, lru = LruGuarded(16, window=64), LRU(16)
    for t in range(2_000):
        key = rng.randrange(40)
        for policy in (g, lru):
            if key in policy:
                policy.on_hit(key, t)
            else:
                policy.on_miss(key, t)
        assert {k for k in range(40) if k in g} == {k for k in range(40) if k in lru}


def test_the_guard_switches_to_recency_when_the_turn_aware_shadow_falls_behind() -> None:
    # Every pause so far took 20 s; now conversations come back after 1.2 s. Ranked by the learned
    # pauses, the one just served looks farthest and leaves first; LRU would keep it.
    guarded, alone = LruGuarded(4, window=16), TurnAwareRetention(4)
    at = learn_gaps(guarded, 20_000, n=20)
    learn_gaps(alone, 20_000, n=20)
    misses = {"guarded": 0, "alone": 0}
    for i in range(30):
        blocks = [f"n{i}a", f"n{i}b"]
        for p in (guarded, alone):
            turn(p, f"n{i}", blocks, at)
        at += 600
        for name, p in (("guarded", guarded), ("alone", alone)):
            misses[name] += sum(b not in p for b in blocks)
            turn(p, f"n{i}", blocks, at)
        at += 600
    assert guarded.by_recency and guarded.switches >= 1
    assert misses["guarded"] <= 2 < 20 <= misses["alone"]


def test_a_warmup_load_without_a_conversation_keeps_the_blocks_owner() -> None:
    p = TurnAwareRetention(3)
    turn(p, "a", ["a0", "a1"], 0)
    p.on_remove("a1")  # evicted, then brought back by a warmup that names no conversation
    p.on_miss("a1", 500)
    p.ended("a")
    turn(p, "b", ["b0"], 600)
    assert [str(e.key) for e in p.on_miss("b1", 600, 1, AccessMeta(trace_id="b"))] == ["a1"]
    assert p.next_use_in_ms("a", 600) == float("inf")  # the load did not count as a turn of a
    p.on_hit("b0", 700)  # a read naming no conversation leaves b0 with b
    assert [str(e.key) for e in p.on_miss("c0", 800)] == ["a0"]
