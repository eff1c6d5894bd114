"""Hand-worked sequences, one table per policy: (keys, capacity) -> hits and evictions per access."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from policies import ARC, LFU, LRU, LRUK, Belady, Eviction, Policy, WTinyLFU


def run(policy: Policy, keys: str) -> tuple[list[bool], list[list[Eviction]]]:
    hits, evictions = [], []
    for t, key in enumerate(keys):
        hit, evicted = policy.access(key, t)
        hits.append(hit)
        evictions.append(evicted)
    return hits, evictions


def evicted_keys(evictions: list[list[Eviction]]) -> list[list[Hashable]]:
    return [[e.key for e in step] for step in evictions]


CASES = [
    # LRU keeps the most recent: C evicts B (A was just read), then B evicts A.
    ("lru", lambda: LRU(2), "ABACB", "..H..", [[], [], [], ["B"], ["A"]]),
    # LFU: C evicts B (count 1 < A's 2); B then evicts C (count 1, least recent of the ones).
    ("lfu", lambda: LFU(2), "AABCB", ".H...", [[], [], [], ["B"], ["C"]]),
    # LRU-2: one-reference keys go first; among two-reference keys the older 2nd-last reference.
    ("lru2", lambda: LRUK(2), "AABCBAD", ".H...H.", [[], [], [], ["B"], ["C"], [], ["A"]]),
    # ARC (Fig. 4 of the paper, traced by hand): B goes to B1, its ghost hit raises p to 1 and
    # pushes A from T2 to B2; A's ghost hit lowers p to 0 and evicts C from T1.
    ("arc", lambda: ARC(2), "ABACBA", "..H...", [[], [], [], ["B"], ["A"], ["C"]]),
    # W-TinyLFU (window 1, main 1): one-hit wonders leave the window and lose the duel to hot A.
    ("wtinylfu", lambda: WTinyLFU(2, climb=False), "AAABCD", ".HH...", [[], [], [], [], ["B"], ["C"]]),
    # OPT: C is used before B again, so B goes; at the end B is needed never again: bypassed.
    ("opt", lambda: Belady(2, list("ABCACB")), "ABCACB", "...HH.", [[], [], ["B"], [], [], ["B"]]),
    # OPT bypasses a newcomer whose next use is the farthest.
    ("opt-bypass", lambda: Belady(2, list("ABCAB")), "ABCAB", "...HH", [[], [], ["C"], [], []]),
]


@pytest.mark.parametrize(("name", "make", "keys", "hits", "evicted"), CASES, ids=[c[0] for c in CASES])
def test_hand_worked(name: str, make, keys: str, hits: str, evicted: list[list[str]]) -> None:
    policy = make()
    got_hits, got_evictions = run(policy, keys)
    assert "".join("H" if h else "." for h in got_hits) == hits
    assert evicted_keys(got_evictions) == evicted


def test_arc_state_after_ghost_hits() -> None:
    arc = ARC(2)
    run(arc, "ABACBA")
    assert arc.p == 0
    assert list(arc.t2) == ["B", "A"]
    assert list(arc.b1) == ["C"]
    assert not arc.t1


def test_opt_marks_bypass_as_rejected() -> None:
    opt = Belady(2, list("ABCAB"))
    _, evictions = run(opt, "ABCAB")
    assert evictions[2] == [Eviction("C", "rejected")]


def test_opt_refuses_out_of_order_replay() -> None:
    opt = Belady(2, [1, 2])
    with pytest.raises(ValueError):
        opt.access(2, 0)


@pytest.mark.parametrize("make", [lambda: LRU(3), lambda: LFU(3), lambda: LRUK(3)])
def test_size_aware_policies_evict_until_the_newcomer_fits(make) -> None:
    policy = make()
    for key in "ABC":
        policy.on_miss(key, 0, size=1)
    evicted = policy.on_miss("big", 1, size=3)
    assert sorted(e.key for e in evicted) == ["A", "B", "C"]
    assert policy.on_miss("huge", 2, size=4) == [Eviction("huge", "rejected")]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LRU(0)
