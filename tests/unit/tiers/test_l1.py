from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest

from policies.base import AccessMeta, Eviction, Policy
from policies.recency.lru import LRU
from services.tiers.l1.cache import L1Cache, L1Hit
from services.tiers.l1.vector_index import normalize

DIM = 8
RNG = np.random.default_rng(5)


class Clock:
    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        return self.now


def at_cosine(v: np.ndarray, cosine: float) -> np.ndarray:
    """A unit vector at exactly `cosine` from unit vector `v`."""
    r = RNG.standard_normal(v.shape).astype(np.float64)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return (cosine * v + np.sqrt(1 - cosine**2) * r).astype(np.float32)


def unit() -> np.ndarray:
    return normalize(RNG.standard_normal(DIM))[0].astype(np.float64)


@pytest.fixture(params=["exact", "ann"])
def cache(request: pytest.FixtureRequest) -> L1Cache:
    # "ann" switches to the HNSW path after 4 entries, so every semantic test covers both paths.
    threshold = 4 if request.param == "ann" else 10_000
    return L1Cache(dim=DIM, capacity_bytes=1 << 20, max_entries=64, clock=Clock(), ann_threshold=threshold)


def test_exact_put_get_overwrite_remove(cache: L1Cache) -> None:
    assert cache.get("k") is None
    cache.put("k", b"v1")
    assert cache.get("k") == b"v1"
    cache.put("k", b"value-2")
    assert cache.get("k") == b"value-2"
    assert len(cache) == 1 and cache.bytes_used == 7
    assert cache.remove("k")
    assert cache.get("k") is None and "k" not in cache and cache.bytes_used == 0
    s = cache.stats()
    assert (s.exact_hits, s.misses) == (2, 2)


def test_ttl_expires_on_read_and_on_sweep() -> None:
    clock = Clock()
    cache = L1Cache(capacity_bytes=1000, max_entries=8, clock=clock)
    cache.put("short", b"a", ttl_hint_ms=100)
    cache.put("long", b"b", ttl_hint_ms=1_000)
    cache.put("forever", b"c")
    clock.now += 99
    assert cache.get("short") == b"a"
    clock.now += 1
    assert cache.get("short") is None  # read at the deadline: expired
    clock.now += 900
    assert [e.key for e in cache.expire()] == ["long"]
    assert cache.get("forever") == b"c" and len(cache) == 1
    assert cache.stats().evictions["expired"] == 2
    assert "short" not in cache.policy and "long" not in cache.policy


def near(cache: L1Cache, q: np.ndarray, **kwargs: Any) -> list[L1Hit]:
    """`semantic_candidates` for one query."""
    return cache.semantic_candidates(np.asarray(q)[None, :], **kwargs)[0]


def test_a_candidate_needs_the_entry_tolerance(cache: L1Cache) -> None:
    v = unit()
    cache.put("q", "answer", embedding=v, similarity_tolerance=0.9)
    for i in range(6):  # enough others to put the "ann" variant on its graph
        cache.put(f"other-{i}", "x", embedding=unit(), similarity_tolerance=0.99)
    found = near(cache, at_cosine(v, 0.91), entry_floor=True)
    assert [h.key for h in found] == ["q"]
    assert found[0].similarity == pytest.approx(0.91, abs=1e-4)
    assert near(cache, at_cosine(v, 0.89), entry_floor=True) == []


def test_min_similarity_only_tightens_the_entry_floor(cache: L1Cache) -> None:
    v = unit()
    cache.put("q", "answer", embedding=v, similarity_tolerance=0.9)
    q = at_cosine(v, 0.93)
    assert near(cache, q, min_similarity=0.95) == []  # caller stricter: none
    assert [h.key for h in near(cache, q, min_similarity=0.5)] == ["q"]  # caller looser: entry's 0.9 holds
    far = at_cosine(v, 0.8)
    assert near(cache, far, min_similarity=0.5) == []
    assert [h.key for h in near(cache, far, min_similarity=0.5, floor_margin=0.15)] == ["q"]
    assert [h.key for h in near(cache, far, min_similarity=0.5, entry_floor=False)] == ["q"]


def test_a_lenient_runner_up_is_a_candidate_when_the_nearest_is_strict(cache: L1Cache) -> None:
    v = unit()
    cache.put("strict", "s", embedding=at_cosine(v, 0.99), similarity_tolerance=0.999)
    cache.put("lenient", "l", embedding=at_cosine(v, 0.95), similarity_tolerance=0.8)
    assert [h.key for h in near(cache, v)] == ["lenient"]
    assert [h.key for h in near(cache, v, entry_floor=False)] == ["strict", "lenient"]


def test_semantic_candidates_can_be_limited_to_a_model(cache: L1Cache) -> None:
    v = unit()
    cache.put("a", "from-7b", embedding=v, model="llama-7b")
    assert near(cache, v, model="llama-13b") == []
    found = near(cache, v, model="llama-7b")
    assert [h.value for h in found] == ["from-7b"]


def test_semantic_entries_expire(cache: L1Cache) -> None:
    v = unit()
    cache.put("q", "answer", embedding=v, ttl_hint_ms=50)
    assert isinstance(cache.clock, Clock)
    cache.clock.now += 50
    assert near(cache, v) == []
    assert len(cache) == 0 and (cache.index is not None and len(cache.index) == 0)


def test_batched_lookups_agree_with_single_ones(cache: L1Cache) -> None:
    vecs = [unit() for _ in range(20)]
    for i, v in enumerate(vecs):
        cache.put(f"k{i}", i, size_bytes=8, embedding=v)
    keys = [f"k{i}" for i in range(0, 25, 2)]
    assert cache.get_many(keys) == [cache.get(k) for k in keys]
    queries = np.stack([at_cosine(v, 0.97) for v in vecs[:10]] + [unit() for _ in range(3)])
    batch = cache.semantic_candidates(queries)
    singles = [near(cache, q) for q in queries]
    assert [[h.key for h in found] for found in batch] == [[h.key for h in found] for found in singles]
    assert [found[0].key for found in batch[:10]] == [f"k{i}" for i in range(10)]


def test_a_candidate_counts_as_a_hit_once_served(cache: L1Cache) -> None:
    v = unit()
    cache.put("prompt:1", "answer", embedding=v)
    assert cache.get("prompt:1") == "answer"
    assert cache.get("prompt:paraphrase") is None
    found = near(cache, at_cosine(v, 0.97))
    assert [h.key for h in found] == ["prompt:1"]
    assert cache.stats().semantic_hits == 0  # a candidate is not a hit until served
    cache.note_semantic_hit("prompt:1")
    assert near(cache, -v) == []  # nothing near: a miss
    s = cache.stats()
    assert (s.exact_hits, s.semantic_hits, s.misses) == (1, 1, 2)


def test_byte_capacity_evicts_least_recently_used() -> None:
    cache = L1Cache(capacity_bytes=30, max_entries=100, clock=Clock())
    for k in "abc":
        cache.put(k, b"x" * 10)
    cache.get("a")
    evicted = cache.put("d", b"y" * 10)
    assert evicted == [Eviction("b")]
    assert "b" not in cache and cache.bytes_used == 30
    assert cache.put("huge", b"z" * 31) == [Eviction("huge", "rejected")]
    assert "huge" not in cache and len(cache) == 3


def test_embedding_bytes_count_toward_capacity() -> None:
    cache = L1Cache(dim=DIM, capacity_bytes=1000, max_entries=10, clock=Clock())
    cache.put("k", b"12345", embedding=unit())
    assert cache.bytes_used == 5 + DIM * 4


def test_entry_bound_holds_whatever_the_sizes() -> None:
    cache = L1Cache(capacity_bytes=1 << 20, max_entries=3, clock=Clock())
    for i in range(10):
        cache.put(f"k{i}", b"tiny")
        assert len(cache) <= 3
    assert [k for k in (f"k{i}" for i in range(10)) if k in cache] == ["k7", "k8", "k9"]


class ScriptedPolicy(Policy):
    """A stand-in for the heat policy: records what L1 tells it and evicts what it is told to."""

    name = "scripted"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.resident: set[Hashable] = set()
        self.calls: list[tuple[str, Hashable]] = []
        self.next_victims: list[Eviction] = []

    def __contains__(self, key: Hashable) -> bool:
        return key in self.resident

    def __len__(self) -> int:
        return len(self.resident)

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self.calls.append(("hit", key))

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        self.calls.append(("miss", key))
        victims, self.next_victims = self.next_victims, []
        self.resident.add(key)
        for v in victims:
            self.resident.discard(v.key)
        return victims

    def on_remove(self, key: Hashable) -> None:
        self.calls.append(("remove", key))
        self.resident.discard(key)


def test_policy_decides_evictions() -> None:
    policy = ScriptedPolicy(1000)
    cache = L1Cache(capacity_bytes=1000, max_entries=10, policy=policy, clock=Clock())
    cache.put("a", b"1")
    cache.put("b", b"2")
    cache.get("a")
    policy.next_victims = [Eviction("a", "heat")]  # heat says: a is cold
    assert cache.put("c", b"3") == [Eviction("a", "heat")]
    assert "a" not in cache and "b" in cache and "c" in cache
    cache.remove("b")
    assert policy.calls == [("miss", "a"), ("miss", "b"), ("hit", "a"), ("miss", "c"), ("remove", "b")]
    # Decisions the policy makes on its own schedule (a heat re-score) are applied as-is.
    cache.apply_evictions([Eviction("c", "cold_cluster"), Eviction("never-cached", "heat")])
    assert len(cache) == 0
    assert cache.stats().evictions == {"heat": 1, "removed": 1, "cold_cluster": 1}


def test_policy_rejection_leaves_nothing_behind() -> None:
    policy = ScriptedPolicy(1000)
    cache = L1Cache(dim=DIM, capacity_bytes=1000, max_entries=10, policy=policy, clock=Clock())
    policy.next_victims = [Eviction("k", "rejected")]
    v = unit()
    assert cache.put("k", b"v", embedding=v) == [Eviction("k", "rejected")]
    assert "k" not in cache and near(cache, v) == [] and cache.bytes_used == 0


def test_policy_capacity_must_match() -> None:
    with pytest.raises(ValueError, match="capacity"):
        L1Cache(capacity_bytes=100, policy=LRU(50))


def test_hash_collision_keeps_the_newest_key() -> None:
    cache = L1Cache(capacity_bytes=100, max_entries=4, clock=Clock(), hasher=lambda key: 42)
    cache.put("a", b"1")
    cache.put("b", b"2")  # same 64-bit hash: "a" makes way rather than being answered for "b"
    assert cache.get("a") is None and cache.get("b") == b"2"
    assert len(cache) == 1 and "a" not in cache.policy


def test_invalidate_similar_drops_close_entries(cache: L1Cache) -> None:
    v = unit()
    cache.put("close", 1, size_bytes=1, embedding=at_cosine(v, 0.95))
    cache.put("far", 2, size_bytes=1, embedding=at_cosine(v, 0.5))
    cache.put("plain", 3, size_bytes=1)
    assert cache.invalidate_similar(v, 0.92) == ["close"]
    assert "far" in cache and "plain" in cache and "close" not in cache


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"ttl_hint_ms": 0}, "ttl_hint_ms"),
        ({"similarity_tolerance": 1.5}, "similarity_tolerance"),
        ({"embedding": np.zeros(DIM)}, "nonzero"),
    ],
)
def test_put_validates(kwargs: dict, error: str) -> None:
    cache = L1Cache(dim=DIM, capacity_bytes=100, max_entries=4, clock=Clock())
    with pytest.raises(ValueError, match=error):
        cache.put("k", b"v", **kwargs)


def test_semantic_needs_a_dimension_and_values_need_a_size() -> None:
    cache = L1Cache(capacity_bytes=100, max_entries=4, clock=Clock())
    with pytest.raises(ValueError, match="without dim"):
        cache.put("k", b"v", embedding=np.ones(4))
    with pytest.raises(TypeError, match="size_bytes"):
        cache.put("k", object())
    assert cache.semantic_candidates(np.ones((1, 4))) == [[]]


def test_slots_are_reused_after_churn() -> None:
    cache = L1Cache(dim=DIM, capacity_bytes=10_000, max_entries=16, clock=Clock(), ann_threshold=8)
    for round_ in range(20):
        for i in range(16):
            cache.put(f"r{round_}-{i}", b"v", embedding=unit())
    assert len(cache) == 16 and cache.index is not None and len(cache.index) == 16
    assert all(cache.get(f"r19-{i}") == b"v" for i in range(16))


def test_peek_touch_and_similar_keys_read_without_side_effects() -> None:
    clock = Clock()
    cache = L1Cache(dim=DIM, capacity_bytes=64, max_entries=8, clock=clock)
    v = unit()
    cache.put("a", b"0123456789ab", embedding=None)
    cache.put("b", b"0123456789ab", embedding=None)
    cache.put("s", b"x", embedding=v, ttl_hint_ms=50)
    before = cache.stats()
    assert cache.peek("a") == b"0123456789ab" and cache.peek("nope") is None
    assert cache.similar_keys(at_cosine(v, 0.95), 0.9) == ["s"]
    assert cache.similar_keys(at_cosine(v, 0.85), 0.9) == []
    assert cache.stats() == before  # no hits, misses or removals counted
    assert cache.touch("a") and not cache.touch("nope")
    cache.put("c", b"0123456789ab")  # 12 + 12 + (1 + 32) + 12 > 64: LRU evicts b, since a was touched
    assert "a" in cache and "b" not in cache
    clock.now += 50
    assert cache.peek("s") is None


def test_scalar_and_vectorised_probes_agree_under_churn() -> None:
    """The scalar probes read a key -> slot dict, the batch probe the cuckoo table: puts, updates,
    evictions, removes, expiries and hash collisions keep the two answering alike."""
    rng = np.random.default_rng(11)
    clock = Clock()
    # A narrow hash (64 values) makes collisions common; the policy evicts as the cache fills.
    cache = L1Cache(capacity_bytes=400, max_entries=48, clock=clock, hasher=lambda key: 1 + hash(key) % 64)
    universe = [f"k{i}" for i in range(120)]
    for step in range(3_000):
        key = universe[int(rng.integers(len(universe)))]
        op = rng.random()
        if op < 0.5:
            cache.put(
                key,
                f"{key}@{step}",
                size_bytes=int(rng.integers(1, 20)),
                ttl_hint_ms=int(rng.integers(5, 400)),
            )
        elif op < 0.6:
            cache.remove(key)
        elif op < 0.7:
            clock.now += int(rng.integers(1, 50))
        elif op < 0.75:
            cache.expire()
        else:
            cache.get(key)
        if step % 50 == 0:
            probe = universe[:60]
            assert cache.get_many(probe) == [cache.get(k) for k in probe]
            assert sorted(cache.keys()) == sorted(k for k in universe if k in cache)
            assert len(cache) == len(cache.keys())
