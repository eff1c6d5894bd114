"""LIRS against hand-worked sequences and the behaviours the paper claims (Jiang & Zhang 2002)."""

from __future__ import annotations

import pytest

from policies import LIRS, LRU, Policy
from policies.adaptive.lirs import Status


def run(policy: Policy, keys: list[int]) -> tuple[str, list[list[object]]]:
    hits, evicted = [], []
    for t, key in enumerate(keys):
        hit, out = policy.access(key, t)
        hits.append("H" if hit else ".")
        evicted.append([e.key for e in out])
    return "".join(hits), evicted


def test_warm_up_fills_the_lir_set_then_hir_blocks_share_one_slot() -> None:
    # Capacity 3: two LIR slots and one resident HIR slot (Q).
    lirs = LIRS(3, hir_percent=0.34)
    hits, evicted = run(lirs, [1, 2, 3, 4, 5])
    assert hits == "....."
    assert evicted == [[], [], [], [3], [4]]  # HIR blocks replace each other; 1 and 2 stay
    assert lirs.status[1] == lirs.status[2] == Status.LIR
    assert lirs.status[5] == Status.HIR and lirs.status[4] == Status.GHOST


def test_a_ghost_that_returns_before_the_oldest_lir_block_takes_its_place() -> None:
    lirs = LIRS(3, hir_percent=0.34)
    run(lirs, [1, 2, 3, 2, 4])  # 2 is re-read: 1 is now the oldest LIR block
    _, evicted = run(lirs, [3])  # 3's ghost has a lower IRR than 1: it becomes LIR, 1 goes to Q
    assert evicted == [[4]]
    assert lirs.status[3] == Status.LIR and lirs.status[1] == Status.HIR
    assert 1 in lirs and list(lirs.queue) == [1]


def test_a_resident_hir_block_hit_in_the_stack_is_promoted() -> None:
    lirs = LIRS(3, hir_percent=0.34)
    run(lirs, [1, 2, 3])
    hits, _ = run(lirs, [3])
    assert hits == "H"
    assert lirs.status[3] == Status.LIR and lirs.status[1] == Status.HIR
    assert lirs.lir == 2 and len(lirs.queue) == 1


def test_a_loop_larger_than_the_cache_still_hits_where_lru_never_does() -> None:
    loop = list(range(12)) * 20
    lirs = LIRS(8)
    lirs_hits = sum(lirs.access(k, t)[0] for t, k in enumerate(loop))
    lru = LRU(8)
    lru_hits = sum(lru.access(k, t)[0] for t, k in enumerate(loop))
    assert lru_hits == 0
    assert lirs_hits >= 19 * 7  # the LIR blocks stay put and hit on every pass after the first


@pytest.mark.parametrize("ghost_factor", [1.0, 3.0])
def test_ghosts_are_bounded(ghost_factor: float) -> None:
    lirs = LIRS(10, ghost_factor=ghost_factor)
    for t, key in enumerate(range(1000)):
        lirs.access(key, t)
        assert len(lirs.ghosts) <= ghost_factor * 10
        assert len(lirs) <= 10
    assert len(lirs.status) <= 10 + ghost_factor * 10


def test_remove_keeps_lir_and_hir_counts() -> None:
    lirs = LIRS(4, hir_percent=0.25)
    run(lirs, [1, 2, 3, 4])
    lirs.on_remove(1)  # LIR
    lirs.on_remove(4)  # HIR
    assert 1 not in lirs and 4 not in lirs
    assert lirs.lir == 2 and not lirs.queue and len(lirs) == 2
