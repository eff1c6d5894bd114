"""The AI-native policy's own behaviours: admission, prefix order, lifecycle, clusters, TTL, the
signals the heat service feeds it, learning, and determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import LRU, AccessMeta, Belady, Eviction
from policies.learned import panel as panel_module
from policies.learned.heat import HeatPolicy


def small(**kw: object) -> HeatPolicy:
    return HeatPolicy(**kw)  # type: ignore[arg-type]


def test_one_hit_wonders_cannot_push_out_hot_entries() -> None:
    policy = small(capacity=20)
    t = 0
    for _ in range(5):
        for key in range(15):
            policy.access(key, t)
            t += 1
    for wonder in range(1000, 1300):
        policy.access(wonder, t)
        t += 1
    assert all(key in policy for key in range(15))


def test_leaves_go_before_roots_and_orphans_are_not_admitted() -> None:
    policy = small(capacity=3)
    evicted: list[object] = []
    for parent, key in [(None, 1), (1, 2), (2, 3), (None, 10), (10, 11)]:
        _, out = policy.access(key, 0, meta=AccessMeta(parent=parent))
        evicted += [e.key for e in out]
    assert evicted == [3, 2]
    assert 1 in policy
    _, out = policy.access(99, 1, meta=AccessMeta(parent=12345))
    assert [(e.key, e.reason) for e in out] == [(99, "rejected")]
    assert 99 not in policy


def test_end_trace_evicts_its_entries_leaves_first() -> None:
    policy = small(capacity=10)
    policy.access("a", 0, meta=AccessMeta(trace_id="t1"))
    policy.access("b", 1, meta=AccessMeta(trace_id="t1", parent="a"))
    policy.access("c", 2, meta=AccessMeta(trace_id="t2"))
    out = policy.end_trace("t1", 3)
    assert [(e.key, e.reason) for e in out] == [("b", "context_ended"), ("a", "context_ended")]
    assert "c" in policy and "a" not in policy
    assert policy.end_trace("unknown", 4) == []


def test_end_trace_lazily_puts_its_entries_first_in_line() -> None:
    policy = small(capacity=3)
    for t, key in enumerate("xyz"):
        for _ in range(3):
            policy.access(key, t, meta=AccessMeta(trace_id="t-" + key))
    assert policy.end_trace("t-y", 10, evict=False) == []
    assert "y" in policy
    _, out = policy.access("new", 11)
    assert ("y", "context_ended") in [(e.key, e.reason) for e in out]


def test_a_cold_cluster_is_evicted_together() -> None:
    policy = small(capacity=6, cold_cluster=0.99)
    for t, key in enumerate([0, 1, 2]):
        policy.access(key, t, meta=AccessMeta(cluster=7))
    for t in range(4):
        policy.access(50, 10 + t)
    policy.access(10, 20, meta=AccessMeta(cluster=8))
    for t in range(3):
        policy.access(11, 30 + t, meta=AccessMeta(cluster=8))  # a frequent window candidate
    _, out = policy.access(99, 100)
    assert sorted(e.key for e in out) == [0, 1, 2]
    assert {e.reason for e in out} == {"cold_cluster"}


def test_hot_neighbours_keep_an_entry_alive() -> None:
    policy = small(capacity=10, rescore_ms=1)
    for t in range(20):
        policy.access("hot", t)
    policy.access("near", 21)
    policy.observe_cluster("hot", 1)
    policy.observe_cluster("near", 1, distance=0.0)
    policy.access("far", 22)
    policy.observe_cluster("far", 1, distance=0.5)
    policy.rescore(200)
    hot, near, far = policy.heat("hot"), policy.heat("near"), policy.heat("far")
    assert hot is not None and near is not None and far is not None
    assert near == pytest.approx(hot, rel=1e-6)
    assert far < near
    decisions = {s.key: s for s in policy.scores()}
    assert decisions["near"].cluster == 1
    assert {s.decision for s in decisions.values()} <= {"keep", "evict", "keep-alive"}


def test_attention_heat_from_kv_events_lands_on_the_entry() -> None:
    policy = small(capacity=4)
    policy.observe_attention_heat("later", 0.9)  # the event may arrive before the access
    policy.access("later", 0)
    policy.access("now", 1)
    policy.observe_attention_heat("now", 7.0)  # clamped
    t = policy.table
    assert t.attention[policy._slot["later"]] == pytest.approx(0.9)
    assert t.attention[policy._slot["now"]] == 1.0
    assert t.has_attention[policy._slot["now"]]


def test_expired_entries_go() -> None:
    policy = small(capacity=4)
    policy.access("short", 0, meta=AccessMeta(ttl_ms=10))
    policy.access("long", 0, meta=AccessMeta(ttl_ms=10_000))
    out = policy.expire(50)
    assert [(e.key, e.reason) for e in out] == [("short", "expired")]
    assert "long" in policy


def test_sizes_are_honoured() -> None:
    policy = small(capacity=10)
    policy.on_miss("a", 0, size=4)
    policy.on_miss("b", 1, size=4)
    out = policy.on_miss("c", 2, size=4)
    assert policy.used <= 10 and len(out) == 1
    assert policy.on_miss("huge", 3, size=11) == [type(out[0])("huge", "rejected")]


def test_model_learns_a_planted_pattern_end_to_end() -> None:
    """Newcomers reported hot by attention come back; cold ones never do. After training, two
    otherwise identical newcomers differ in heat by their attention."""
    policy = small(capacity=64, warmup_labels=64, candidate_sample_rate=1.0, rescore_ms=20, horizon=400)
    rng = np.random.default_rng(0)
    comeback: dict[int, int] = {}
    fresh = 10_000
    for t in range(6000):
        due = comeback.pop(t, None)
        if due is not None:
            policy.access(due, t)
            continue
        fresh += 1
        hot = bool(rng.random() < 0.5)
        policy.access(fresh, t, meta=AccessMeta(attention_heat=1.0 if hot else 0.0))
        if hot:
            comeback.setdefault(t + 50, fresh)
    assert policy.model_active
    probe = policy.table
    hot_slot = policy._stage("probe-hot", 1, -1, AccessMeta(attention_heat=1.0))
    hot_heat = policy._score_one(hot_slot, "probe-hot")
    policy._unstage(hot_slot)
    cold_slot = policy._stage("probe-cold", 1, -1, AccessMeta(attention_heat=0.0))
    cold_heat = policy._score_one(cold_slot, "probe-cold")
    policy._unstage(cold_slot)
    assert hot_heat > cold_heat + 0.2
    assert probe.used.sum() == len(policy)


def replay_evictions(seed: int) -> list[tuple[object, str]]:
    policy = HeatPolicy(32, seed=seed, warmup_labels=32, rescore_ms=10)
    rng = np.random.default_rng(1)
    out = []
    for t, key in enumerate(rng.zipf(1.3, size=3000) % 200):
        _, evicted = policy.access(int(key), t)
        out += [(e.key, e.reason) for e in evicted]
    return out


def test_deterministic_under_a_seed() -> None:
    assert replay_evictions(5) == replay_evictions(5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.lists(st.integers(0, 15), min_size=50, max_size=300), capacity=st.integers(1, 8))
def test_trained_model_still_keeps_the_contract(seq: list[int], capacity: int) -> None:
    policy = HeatPolicy(
        capacity, warmup_labels=8, rescore_ms=5, sample_per_rescore=4, candidate_sample_rate=1.0
    )
    opt = Belady(capacity, seq)
    hits = opt_hits = 0
    for t, key in enumerate(seq):
        hit, evicted = policy.access(key, t)
        hits += hit
        opt_hits += opt.access(key, t)[0]
        assert len(policy) <= capacity
        assert all(e.key not in policy for e in evicted)
    assert hits <= opt_hits


# -- following the expert panel ------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.lists(st.integers(0, 20), min_size=1, max_size=200), capacity=st.integers(1, 8))
def test_a_one_expert_panel_is_that_expert(seq: list[int], capacity: int) -> None:
    """The resident set follows the leader exactly: alone, LRU decides every hit and eviction."""
    policy = HeatPolicy(capacity, experts=("lru",))
    lru = LRU(capacity)
    for t, key in enumerate(seq):
        hit, evicted = policy.access(key, t)
        lru_hit, lru_evicted = lru.access(key, t)
        assert hit == lru_hit
        assert [e.key for e in evicted] == [e.key for e in lru_evicted]


def test_a_loop_moves_the_lead_from_lru_to_lirs() -> None:
    policy = HeatPolicy(50, experts=("lru", "lirs"))
    hits = [policy.access(key, t)[0] for t, key in enumerate(list(range(80)) * 30)]
    assert policy.leader == "lirs"
    assert sum(hits[-80:]) >= 40  # LRU would miss every access of a loop larger than the cache


def test_a_costly_migration_keeps_the_leader() -> None:
    policy = HeatPolicy(50, experts=("lru", "lirs"), migration_cost=1e9)
    for t, key in enumerate(list(range(80)) * 30):
        policy.access(key, t)
    assert policy.leader == "lru"


def test_the_cache_bypasses_what_the_leader_bypasses(monkeypatch: pytest.MonkeyPatch) -> None:
    class Frozen(LRU):
        """Admits while there is room, then never again."""

        def on_miss(self, key, now_ms, size=1, meta=None):  # type: ignore[no-untyped-def]
            if len(self) >= self.capacity:
                return [Eviction(key, "rejected")]
            return super().on_miss(key, now_ms, size, meta)

    monkeypatch.setitem(panel_module.FACTORIES, "frozen", lambda capacity, seed: Frozen(capacity))
    policy = HeatPolicy(3, experts=("frozen",))
    for t, key in enumerate([1, 2, 3]):
        policy.access(key, t)
    assert policy.access(4, 3) == (False, [Eviction(4, "rejected")])
    assert all(key in policy for key in (1, 2, 3))


def test_doomed_entries_go_before_the_leaders_victim() -> None:
    policy = HeatPolicy(3, experts=("lru",))
    policy.access("a", 0)
    policy.access("b", 1, meta=AccessMeta(trace_id="t"))
    policy.access("c", 2)
    policy.end_trace("t", 3, evict=False)
    _, out = policy.access("d", 4)  # LRU would evict a; the ended conversation's entry goes first
    assert [(e.key, e.reason) for e in out] == [("b", "context_ended")]


def test_prefix_chains_retire_the_panel_and_evict_by_recency_and_frequency() -> None:
    policy = HeatPolicy(6, chain_half_life=100.0)
    assert policy.panel is not None

    def request(t: int, *chain: int) -> None:
        parent = None
        for key in chain:
            policy.access(key, t, meta=AccessMeta(parent=parent))
            parent = key

    for t in range(3):
        request(t, 1, 2, 3)  # a popular chain
    request(3, 10, 11, 12)  # used once, and more recently
    assert policy.panel is None
    request(4, 20, 21)  # room for two more blocks: the once-used chain gives way, leaf first
    assert all(key in policy for key in (1, 2, 3, 20, 21))
    assert 10 in policy and 11 not in policy and 12 not in policy


def test_prefix_chains_on_the_prior_leave_the_model_untrained() -> None:
    policy = HeatPolicy(16, warmup_labels=8, rescore_ms=1, candidate_sample_rate=1.0)
    for t in range(200):
        parent = None
        for key in (t % 5, 100 + t % 7, 1000 + t):
            policy.access(key, t, meta=AccessMeta(parent=parent))
            parent = key
    assert not policy.learning and not policy.model_active
    assert policy.scorer.steps == 0
    assert all(0.0 <= s.score <= 1.0 for s in policy.scores())


def test_ablate_reaches_the_model_and_is_off_by_default() -> None:
    assert small(capacity=10).scorer.keep is None
    keep = small(capacity=10, ablate=["chain"]).scorer.keep
    assert keep is not None and int((keep == 0).sum()) == 2
