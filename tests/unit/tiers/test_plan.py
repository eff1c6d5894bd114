"""The lookup plan's order and rules (plan.py), and the walk's bookkeeping; the tiered cache executing it
is tested in test_tiered.py."""

from __future__ import annotations

import numpy as np

from services.tiers.entry import Entry, EntryMeta
from services.tiers.node.plan import LOCAL_PLAN, PLAN, Query, Walk


def test_the_plan_walks_tier_by_tier_exact_before_the_embedding() -> None:
    assert [(s.source, s.match) for s in PLAN] == [
        ("l1", "exact"),
        ("l1", "semantic"),
        ("l2", "exact"),
        ("peers", "exact"),
        ("l3", "exact"),
        ("l3", "semantic"),
    ]
    assert [s.tier for s in PLAN] == ["l1", "l1", "l2", "l2", "l3", "l3"]


def test_a_local_lookup_uses_only_the_in_process_steps_which_come_first() -> None:
    assert LOCAL_PLAN == PLAN[:3] and all(s.in_process for s in LOCAL_PLAN)
    assert not any(s.in_process for s in PLAN[3:])


def test_only_l3_is_behind_the_breaker_and_hits_below_l1_are_promoted() -> None:
    assert [s.guarded for s in PLAN] == [False, False, False, False, True, True]
    assert [s.promote for s in PLAN] == [(), (), ("l1",), ("l1", "l2"), ("l1", "l2"), ("l1", "l2")]
    assert [s.fused_with_next for s in PLAN] == [False, False, False, False, True, False]


def test_a_step_is_asked_for_the_open_queries_holding_what_it_needs() -> None:
    vec = np.ones(4, dtype=np.float32)
    walk = Walk([Query(key="a"), Query(embedding=vec), Query(key="b", embedding=vec)], batched=True)
    exact, semantic = PLAN[0], PLAN[1]
    assert walk.todo(exact) == [0, 2] and walk.todo(semantic) == [1, 2]
    entry = Entry(EntryMeta(key="b", kind="prompt", model="m"), b"")
    walk.hit(2, exact, entry, 1.0)
    assert walk.todo(semantic) == [1]
    found = walk.found[2]
    assert found is not None and (found.tier, found.match, found.peer) == ("l1", "exact", None)
    walk.close(1)
    assert walk.todo(semantic) == [] and walk.found[1] is None


def test_only_a_guarded_step_that_did_not_run_degrades_the_answer() -> None:
    walk = Walk([Query(key="a"), Query(key="b")], batched=True)
    peers, l3 = PLAN[3], PLAN[4]
    walk.asked(0, peers, False)
    walk.asked(1, l3, True)
    assert walk.degraded == [False, False]
    walk.asked(0, l3, False)
    walk.asked(0, l3, True)
    assert walk.degraded == [True, False]
