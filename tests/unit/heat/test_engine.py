"""The heat service's event handling without Kafka: events feed the policy, re-score rounds turn
scores into decisions, and only changes are published."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from policies.base import AccessMeta
from policies.learned.compiled import CompiledHeat
from policies.learned.features import N_FEATURES
from policies.learned.heat import HeatPolicy
from policies.learned.signals import HeatScore
from schemas.events import (
    AttentionHeatReported,
    CacheAccessed,
    ConversationEnded,
    KvBlockRemoved,
    KvBlockStored,
    access_batch,
)
from services.heat.checkpoint import dump_scorer, load_scorer
from services.heat.engine import HeatEngine, attention_heat
from sim.generated import mixed_prefix_trace
from sim.replay import replay


def _engine(capacity: int = 64) -> HeatEngine:
    return HeatEngine(HeatPolicy(capacity, seed=7))


def test_accesses_become_keep_decisions_once() -> None:
    engine = _engine()
    for i in range(10):
        engine.apply(CacheAccessed(key=f"k{i}", hit=False, occurred_at_ms=1000 + i))
    first = engine.rescore(2000, limit=100)
    assert {d.key for d in first} == {f"k{i}" for i in range(10)}
    assert all(d.decision in ("keep", "keep_alive") and 0.0 <= d.score <= 1.0 for d in first)
    assert engine.rescore(2100, limit=100) == []  # nothing changed: nothing published


def test_ended_conversation_evicts_its_entries() -> None:
    engine = _engine()
    for i in range(5):
        engine.apply(CacheAccessed(key=f"t{i}", hit=False, trace_id="conv-1", occurred_at_ms=10 + i))
    engine.apply(CacheAccessed(key="other", hit=False, trace_id="conv-2", occurred_at_ms=20))
    engine.rescore(30, limit=100)
    engine.apply(ConversationEnded(trace_id="conv-1", occurred_at_ms=40))
    decisions = engine.rescore(50, limit=100)
    evicted = {d.key for d in decisions if d.decision == "evict"}
    assert evicted == {f"t{i}" for i in range(5)}
    assert "other" in engine.policy and "t0" not in engine.policy


def test_the_limit_defers_decisions_to_the_next_round() -> None:
    engine = _engine()
    for i in range(20):
        engine.apply(CacheAccessed(key=f"k{i}", hit=False, occurred_at_ms=i))
    first = engine.rescore(100, limit=8)
    second = engine.rescore(200, limit=100)
    assert len(first) == 8 and len({d.key for d in first + second}) == 20


def test_kv_events_track_blocks_and_their_removal() -> None:
    engine = _engine()
    engine.apply(KvBlockStored(block_hash="b0", occurred_at_ms=1, head_heat=[0.1, 3.0]))
    engine.apply(KvBlockStored(block_hash="b1", parent_block_hash="b0", occurred_at_ms=2))
    engine.apply(AttentionHeatReported(block_hash="b1", head_heat=[0.5], occurred_at_ms=3))
    assert "b0" in engine.policy and "b1" in engine.policy
    engine.apply(KvBlockRemoved(block_hash="b1", occurred_at_ms=4))
    assert "b1" not in engine.policy


def test_attention_heat_is_bounded() -> None:
    assert attention_heat([]) == 0.0
    assert 0.0 < attention_heat([0.2, -5.0]) < 1.0
    assert attention_heat([1.0]) == 0.5


def test_a_checkpoint_restores_the_same_model() -> None:
    trained = HeatPolicy(64, seed=1).scorer
    for i in range(300):
        trained.observe(np.full(N_FEATURES, (i % 7) / 7, dtype=np.float32), float(i % 2))
    trained.train(steps=5)
    fresh = HeatPolicy(64, seed=2).scorer
    x = np.linspace(0, 1, 4 * N_FEATURES, dtype=np.float32).reshape(4, N_FEATURES)
    assert not np.array_equal(fresh.score(x), trained.score(x))
    load_scorer(fresh, dump_scorer(trained).blob)
    assert fresh.steps == trained.steps == 5 and fresh.labels_seen == trained.labels_seen == 300
    assert np.array_equal(fresh.score(x), trained.score(x))


def test_a_checkpoint_restores_the_chain_re_use_counts() -> None:
    trained = HeatPolicy(64, seed=1)
    assert trained.chain_reuse is not None
    for tick in range(1, 5_000):
        trained.chain_reuse.heard(f"tail{tick}", tick)  # never back: P(re-used | not extended) falls
    fresh = HeatPolicy(64, seed=2)
    assert fresh.chain_reuse is not None and fresh.chain_reuse.probability(False) == 0.5
    load_scorer(fresh.scorer, dump_scorer(trained.scorer, trained.chain_reuse).blob, fresh.chain_reuse)
    assert fresh.chain_reuse.to_dict() == trained.chain_reuse.to_dict()
    assert fresh.chain_reuse.probability(False) < 0.1
    # A checkpoint written without chain counts restores the MLP and leaves the chain model alone.
    before = HeatPolicy(64, seed=3)
    load_scorer(before.scorer, dump_scorer(trained.scorer).blob, before.chain_reuse)
    assert before.chain_reuse is not None and before.chain_reuse.labels == 0


def test_a_checkpoint_with_impossible_chain_counts_is_refused_whole() -> None:
    trained = HeatPolicy(64, seed=1)
    assert trained.chain_reuse is not None
    trained.chain_reuse.yes = [5.0, 0.0]  # more re-used than seen
    fresh = HeatPolicy(64, seed=2)
    with pytest.raises(ValueError, match="yes <= seen"):
        load_scorer(fresh.scorer, dump_scorer(trained.scorer, trained.chain_reuse).blob, fresh.chain_reuse)
    assert fresh.scorer.steps == 0 and fresh.chain_reuse is not None and fresh.chain_reuse.labels == 0


def test_a_checkpoint_keeps_the_half_life_the_guard_moved_to_and_the_chains_start_there() -> None:
    trace = mixed_prefix_trace(1, 3000)
    moved = CompiledHeat(2000)
    replay(trace, moved)
    assert moved.chain_guard is not None
    half_life = moved.chain_guard.state().half_life
    assert half_life != 3.0, "the guard moved it on this traffic"
    fresh = CompiledHeat(2000)
    got = load_scorer(fresh.scorer, dump_scorer(moved.scorer, moved.chain_reuse, half_life).blob)
    assert got == half_life and fresh.start_half_life(got)
    fresh.on_miss(1, 0)
    fresh.on_miss(2, 1, meta=AccessMeta(parent=1))  # the chains begin
    assert fresh.chain_guard is not None and fresh.chain_guard.state().half_life == half_life
    assert not fresh.start_half_life(3.0), "too late once the chains have begun"
    # None from a checkpoint without one; a nonsensical one is refused whole.
    assert load_scorer(fresh.scorer, dump_scorer(moved.scorer).blob) is None
    for bad in (0.0, -3.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="half-life"):
            load_scorer(HeatPolicy(64).scorer, dump_scorer(moved.scorer, None, bad).blob)


def _chain(n: int, t0: int = 100) -> list[KvBlockStored]:
    return [
        KvBlockStored(block_hash=f"c{i}", parent_block_hash=f"c{i - 1}" if i else None, occurred_at_ms=t0 + i)
        for i in range(n)
    ]


def test_a_chain_arriving_out_of_order_is_tracked_whole() -> None:
    # kv.events.v1 is keyed by block hash: a chain's blocks come from different partitions, in any order.
    engine = _engine()
    chain = _chain(6)
    for event in [chain[3], chain[5], chain[1], chain[4], chain[0], chain[2]]:
        engine.apply(event)
    assert all(f"c{i}" in engine.policy for i in range(6))
    assert engine.orphans_parked == 0 and engine.orphans_adopted == 4 and engine.orphans_expired == 0
    assert engine.events_applied == 6


def test_an_orphan_whose_parent_never_comes_is_applied_after_the_hold() -> None:
    engine = HeatEngine(HeatPolicy(64, seed=7), orphan_hold_ms=1_000)
    engine.apply(KvBlockStored(block_hash="x1", parent_block_hash="gone", occurred_at_ms=100))
    engine.apply(CacheAccessed(key="k", hit=False, occurred_at_ms=900))
    assert engine.orphans_parked == 1 and engine.events_applied == 1
    engine.apply(CacheAccessed(key="k", hit=True, occurred_at_ms=1_100))
    assert engine.orphans_parked == 0 and engine.orphans_expired == 1
    assert "x1" not in engine.policy  # applied as it is: the policy rejects an orphan


def test_parked_orphans_are_bounded_and_a_removal_unparks() -> None:
    engine = HeatEngine(HeatPolicy(64, seed=7), max_orphans=3)
    for i in range(5):
        engine.apply(KvBlockStored(block_hash=f"o{i}", parent_block_hash=f"p{i}", occurred_at_ms=10 + i))
    assert engine.orphans_parked == 3 and engine.orphans_expired == 2
    engine.apply(KvBlockRemoved(block_hash="o4", occurred_at_ms=20))
    assert engine.orphans_parked == 2
    engine.apply(KvBlockStored(block_hash="p4", occurred_at_ms=21))
    assert "o4" not in engine.policy  # removed before its parent came: not adopted
    engine.apply(KvBlockStored(block_hash="p3", occurred_at_ms=22))
    assert "o3" in engine.policy


def test_an_idle_round_neither_rescores_nor_trains() -> None:
    engine = _engine()
    for i in range(400):
        engine.apply(CacheAccessed(key=f"k{i % 90}", hit=False, occurred_at_ms=i))
    engine.rescore(500, limit=1000)
    rescores, steps = engine.policy.rescores, engine.policy.scorer.steps
    assert steps > 0
    for round_ms in range(600, 2000, 100):
        assert engine.rescore(round_ms, limit=1000) == []
    assert (engine.policy.rescores, engine.policy.scorer.steps) == (rescores, steps)
    engine.apply(CacheAccessed(key="new", hit=False, occurred_at_ms=2000))
    assert {d.key for d in engine.rescore(2100, limit=1000)} >= {"new"}
    assert engine.policy.rescores > rescores


def test_a_batch_record_is_applied_as_its_events_in_order() -> None:
    accesses = [
        CacheAccessed(key=f"k{i % 4}", hit=i > 3, trace_id="conv-1", occurred_at_ms=1000 + i)
        for i in range(12)
    ]
    one_by_one, batched = _engine(), _engine()
    for event in accesses:
        one_by_one.apply(event)
    batched.apply(access_batch(accesses))
    assert batched.events_applied == one_by_one.events_applied == 12
    assert batched.last_event_ms == 1011
    decided = [
        [(d.key, d.decision, d.score) for d in e.rescore(2000, limit=100)] for e in (batched, one_by_one)
    ]
    assert decided[0] == decided[1] and decided[0]


def test_forget_drops_the_keys_of_revoked_partitions_and_nothing_else() -> None:
    engine = _engine(capacity=256)
    for i in range(40):
        origin = ("cache.access.v1", i % 4)
        engine.apply(CacheAccessed(key=f"k{i}", hit=False, occurred_at_ms=100 + i), origin)
    # A chained block whose parent has not arrived is parked; it goes with its partition too.
    engine.apply(
        KvBlockStored(block_hash="child", parent_block_hash="nowhere", occurred_at_ms=150), ("kv", 1)
    )
    engine.apply(KvBlockStored(block_hash="kept", occurred_at_ms=151), ("kv", 0))
    assert engine.orphans_parked == 1
    queued = engine.rescore(200, limit=1)  # one decision out, the rest still queued
    assert len(queued) == 1

    dropped = engine.forget({("cache.access.v1", 1), ("cache.access.v1", 3), ("kv", 1)})

    gone = {f"k{i}" for i in range(40) if i % 4 in (1, 3)}
    assert dropped == len(gone) + 1 and engine.forgotten == dropped
    assert engine.orphans_parked == 0
    assert not any(k in engine.policy for k in gone)
    kept = {f"k{i}" for i in range(40) if i % 4 in (0, 2)} | {"kept"}
    assert all(k in engine.policy for k in kept)
    # Nothing more is said about the forgotten keys: not what was queued, not in later rounds.
    later = engine.rescore(300, limit=1000)
    assert not {d.key for d in later} & gone
    engine.apply(CacheAccessed(key="k0", hit=True, occurred_at_ms=400), ("cache.access.v1", 0))
    assert not {d.key for d in engine.rescore(500, limit=1000)} & gone
    assert engine.forget({("cache.access.v1", 1)}) == 0  # already gone


def test_origins_are_kept_for_tracked_keys_only_within_a_bound() -> None:
    """Where each key's events came from is pruned to the keys still tracked: a stream of keys far
    beyond the capacity leaves at most 2x the tracked keys (+1024) of origins, and `forget` still
    finds a tracked key's partition afterwards."""
    engine = _engine(capacity=32)
    for i in range(5_000):
        engine.apply(CacheAccessed(key=f"k{i}", hit=False, occurred_at_ms=i), ("cache.access.v1", i % 2))
        assert len(engine._origin) <= 2 * (32 + engine.orphans_parked) + 1024 + 1
    tracked = [f"k{i}" for i in range(5_000) if f"k{i}" in engine.policy]
    assert tracked and engine.forget({("cache.access.v1", 0), ("cache.access.v1", 1)}) == len(tracked)


def test_forget_without_origins_recorded_drops_nothing() -> None:
    engine = _engine()
    engine.apply(CacheAccessed(key="a", hit=False, occurred_at_ms=1))
    assert engine.forget({("cache.access.v1", 0)}) == 0
    assert "a" in engine.policy


def test_a_block_whose_parent_belongs_to_another_owner_starts_a_chain_here() -> None:
    engine = HeatEngine(HeatPolicy(64, seed=7), foreign_parent=lambda parent: parent.startswith("far"))
    engine.apply(KvBlockStored(block_hash="b1", parent_block_hash="far-root", occurred_at_ms=10))
    assert "b1" in engine.policy and engine.orphans_parked == 0  # not parked, not rejected
    engine.apply(KvBlockStored(block_hash="b2", parent_block_hash="b1", occurred_at_ms=11))
    assert "b2" in engine.policy  # and its chain goes on here
    # A parent that would be heard here and has not arrived yet is still waited for.
    engine.apply(KvBlockStored(block_hash="c1", parent_block_hash="near-root", occurred_at_ms=12))
    assert engine.orphans_parked == 1 and "c1" not in engine.policy


class _EveryScore(CompiledHeat):
    """The compiled policy publishing from the whole table (what rounds did before `changed_scores`)."""

    def changed_scores(self) -> Iterator[HeatScore]:
        return self.scores()


def test_a_round_of_the_compiled_core_publishes_what_the_whole_table_would() -> None:
    rng = np.random.default_rng(3)
    ours, whole = HeatEngine(CompiledHeat(300, seed=1)), HeatEngine(_EveryScore(300, seed=1))
    rounds = published = 0
    for t in range(6000):
        root = int(rng.integers(0, 40))  # requests share prefixes: hits, extensions and evictions
        parent = None
        events = []
        for depth in range(int(rng.integers(1, 6))):
            block = f"b{root}-{depth}-{int(rng.integers(0, 3)) if depth > 2 else 0}"
            events.append(
                KvBlockStored(block_hash=block, parent_block_hash=parent, occurred_at_ms=t * 10 + depth)
            )
            parent = block
        if t % 97 == 0:
            events.append(KvBlockRemoved(block_hash=parent, occurred_at_ms=t * 10 + 9))
        for event in events:
            ours.apply(event)
            whole.apply(event)
        if t % 50 == 49:
            got, want = (
                [(d.key, d.score, d.decision, d.cluster) for d in engine.rescore(t * 10 + 9, limit=10_000)]
                for engine in (ours, whole)
            )
            assert got == want, t
            rounds += 1
            published += len(got)
    assert isinstance(ours.policy, CompiledHeat) and ours.policy.core is not None
    assert rounds == 120 and published > 300  # decisions went out, round after round
