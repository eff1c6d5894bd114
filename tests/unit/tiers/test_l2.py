"""The L2 store over the block pool: values span blocks and come back byte for byte, the least recently
used go first when the pool is full, its blocks stay pinned against the pool's own reclaimer, TTLs and
semantic invalidation reach it."""

from __future__ import annotations

import numpy as np
import pytest

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import PAGE_BYTES, BlockPool
from services.tiers.l2.store import L2Store
from tests.unit.tiers.fakes import Clock, at_cosine, unit

RNG = np.random.default_rng(3)


def entry(key: str, size: int, *, embedding: np.ndarray | None = None, ttl: int | None = None) -> Entry:
    blob = RNG.integers(0, 256, size, dtype=np.uint8).tobytes()
    meta = EntryMeta(
        key=key, kind="kv_block", model="m", embedding=embedding, ttl_hint_ms=ttl, updated_at_ms=0
    )
    return Entry(meta, blob)


@pytest.mark.parametrize("size", [1, 255, 256, 2048, 2049, 5000, 16 * 1024, 40_000])
def test_values_round_trip_across_block_spans(size: int) -> None:
    store = L2Store(BlockPool(8, xp=np))
    e = entry("k", size)
    assert store.put(e)
    got = store.get("k")
    assert got is not None and got.blob == e.blob and got.meta == e.meta


def test_full_pool_evicts_least_recently_used_and_keeps_blocks_pinned() -> None:
    clock = Clock()
    pool = BlockPool(1, xp=np, clock=clock, inactive_after_ms=1)
    store = L2Store(pool)
    for key in ("a", "b", "c"):
        assert store.put(entry(key, 8 * 1024))
    assert store.keys() == ["b", "c"]  # one 16 KB page holds two 8 KB values
    assert store.get("b") is not None
    clock.advance(10_000)
    assert pool.sweep() == 0  # pinned: nothing may go Inactive behind the store's back
    assert store.put(entry("d", 8 * 1024))
    assert store.keys() == ["b", "d"]
    assert store.stats().evictions == {"capacity": 2}


def test_too_large_values_are_refused() -> None:
    store = L2Store(BlockPool(1, xp=np), max_value_bytes=4096)
    assert not store.put(entry("big", 4097))
    assert not L2Store(BlockPool(1, xp=np)).put(entry("huge", PAGE_BYTES + 1))
    assert len(store) == 0


def test_replace_and_remove_free_the_blocks() -> None:
    pool = BlockPool(4, xp=np)
    store = L2Store(pool)
    store.put(entry("k", 10_000))
    store.put(entry("k", 300))
    assert store.remove("k") and not store.remove("k")
    assert pool.free_bytes == pool.total_bytes


def test_ttl_sweep_and_semantic_neighbours() -> None:
    store = L2Store(BlockPool(4, xp=np), dim=8)
    base = unit(RNG, 8)
    store.put(entry("close", 100, embedding=at_cosine(RNG, base, 0.95), ttl=50))
    store.put(entry("far", 100, embedding=at_cosine(RNG, base, 0.2)))
    assert store.similar_keys(base, 0.9) == ["close"]
    assert store.expire(49) == [] and store.expire(50) == ["close"]
    assert store.similar_keys(base, 0.9) == [] and store.keys() == ["far"]
