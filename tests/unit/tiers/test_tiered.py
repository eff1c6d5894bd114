"""The tiered cache's rules on fake ports: the tier walk (key before embedding in each tier, other
nodes' L2 between this node's L2 and L3) and promotion, write-with-sync and the delayed double delete,
the invalidation rules on receiving nodes, heat decisions, tier commands, conversation ends, and the L3
circuit breaker with write-behind."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from policies.recency.lru import LRU
from schemas.events import (
    CacheAccessed,
    CacheInvalidated,
    ConversationEnded,
    EvictionRequested,
    HeatScored,
    PromotionRequested,
    WarmupRequested,
    new_event_id,
)
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import Entry, EntryMeta, decode_value, encode_text
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.store import L2Store
from services.tiers.node.outbox import Outbox
from services.tiers.node.plan import Lookup, Pending
from services.tiers.node.tiered import L3Unavailable, Query, TieredCache
from services.tiers.ports import L3Rejected
from tests.unit.tiers.fakes import Clock, FakePeers, MemoryL3, at_cosine, unit

DIM = 16
RNG = np.random.default_rng(11)


@dataclass
class Rig:
    cache: TieredCache
    l3: MemoryL3
    clock: Clock


def make(
    *,
    node: str = "a",
    l1_bytes: int = 1 << 20,
    l1_entries: int = 64,
    l3_latency_ms: int = 0,
    l3: MemoryL3 | None = None,
    max_pending: int = 100,
    write_behind: bool = False,
) -> Rig:
    clock = Clock()
    store = l3 or MemoryL3(clock=clock, latency_ms=l3_latency_ms)
    store.clock = clock
    cache = TieredCache(
        l1=L1Cache(
            dim=DIM,
            capacity_bytes=l1_bytes,
            max_entries=l1_entries,
            policy=LRU(l1_bytes),
            clock=clock,
            ann_threshold=1_000_000,
        ),
        l2=L2Store(BlockPool(8, xp=np, clock=clock), dim=DIM),
        l3=store,
        outbox=Outbox(clock=clock),
        breaker=LatencyBreaker(p99_ms=150, window=50, min_calls=5, cooldown_ms=1000, clock=clock),
        node_id=node,
        wall_ms=clock,
        perf_ns=clock.ns,
        l3_timeout_s=60.0,
        max_pending_l3_writes=max_pending,
        write_behind=write_behind,
    )
    return Rig(cache, store, clock)


def meta(key: str, embedding: np.ndarray | None = None, **kw: object) -> EntryMeta:
    return EntryMeta(key=key, kind="prompt", model=str(kw.pop("model", "m")), embedding=embedding, **kw)  # type: ignore[arg-type]


def text_of(entry: Entry | None) -> str | None:
    return None if entry is None else decode_value(entry.blob).text


def stored(key: str, text: str, clock: Clock, embedding: np.ndarray | None = None, **kw: object) -> Entry:
    """An entry as if written to L3 at the clock's time."""
    m = meta(key, embedding, **kw).with_times(clock(), clock())
    return Entry(m, encode_text(text, model=m.model))


async def test_exact_get_walks_l1_l2_l3_and_promotes() -> None:
    rig = make()
    rig.l3.rows["k"] = stored("k", "from l3", rig.clock)
    first = await rig.cache.get("k")
    assert (first.tier, first.match, text_of(first.entry)) == ("l3", "exact", "from l3")
    assert "k" in rig.cache.l1 and rig.cache.l2 is not None and "k" in rig.cache.l2
    assert (await rig.cache.get("k")).tier == "l1"
    rig.cache.l1.remove("k")
    assert (await rig.cache.get("k")).tier == "l2"
    assert (await rig.cache.get("k")).tier == "l1"
    calls = rig.l3.calls
    assert not (await rig.cache.get("absent")).hit
    assert rig.l3.calls == calls + 1


async def test_begin_answers_from_memory_at_once_and_leaves_the_rest_to_finish() -> None:
    """`begin` (what the wire-level API answers with, without a task) settles an L1/L2 hit itself; a
    lookup that must go on to L3 comes back pending, and `finish` ends it without probing the in-process
    tiers again (one L1 miss counted, one access recorded)."""
    rig = make()
    await rig.cache.put(meta("held"), encode_text("in memory", model="m"))
    rig.l3.rows["far"] = stored("far", "from l3", rig.clock)
    held = rig.cache.begin(Query("held"))
    assert isinstance(held, Lookup) and (held.tier, text_of(held.entry)) == ("l1", "in memory")
    calls, misses, queued = rig.l3.calls, rig.cache.l1.stats().misses, rig.cache.outbox.stats().queued_access
    pending = rig.cache.begin(Query("far"))
    assert isinstance(pending, Pending) and rig.l3.calls == calls
    far = await rig.cache.finish(pending)
    assert (far.tier, text_of(far.entry)) == ("l3", "from l3") and rig.l3.calls == calls + 1
    assert rig.cache.l1.stats().misses == misses + 1
    assert rig.cache.outbox.stats().queued_access == queued + 1


async def test_semantic_get_walks_l1_then_l3_and_respects_tolerance_and_model() -> None:
    rig = make()
    base = unit(RNG, DIM)
    rig.l3.rows["s"] = stored("s", "paris", rig.clock, base, similarity_tolerance=0.9)
    miss = await rig.cache.get(embedding=at_cosine(RNG, base, 0.85))
    assert not miss.hit
    assert not (await rig.cache.get(embedding=at_cosine(RNG, base, 0.95), model="other")).hit
    hit = await rig.cache.get(embedding=at_cosine(RNG, base, 0.95))
    assert (hit.tier, hit.match, text_of(hit.entry)) == ("l3", "semantic", "paris")
    assert hit.similarity == pytest.approx(0.95, abs=1e-4)
    again = await rig.cache.get(embedding=at_cosine(RNG, base, 0.95))
    assert (again.tier, again.match) == ("l1", "semantic")
    strict = await rig.cache.get(embedding=at_cosine(RNG, base, 0.95), tolerance=0.99)
    assert not strict.hit


async def test_exact_key_goes_before_the_embedding() -> None:
    rig = make()
    base = unit(RNG, DIM)
    await rig.cache.put(meta("near", base), encode_text("semantic", model="m"))
    await rig.cache.put(meta("exact"), encode_text("exact", model="m"))
    both = await rig.cache.get("exact", base)
    assert (both.match, text_of(both.entry)) == ("exact", "exact")
    fallback = await rig.cache.get("unknown", base)
    assert (fallback.match, text_of(fallback.entry)) == ("semantic", "semantic")
    with pytest.raises(ValueError):
        await rig.cache.get()


async def test_a_conclusive_answer_in_memory_never_waits_on_l3() -> None:
    rig = make()
    base = unit(RNG, DIM)
    await rig.cache.put(meta("in-l1", base), encode_text("semantic", model="m"))
    rig.l3.rows["only-in-l3"] = stored("only-in-l3", "exact", rig.clock)
    calls = rig.l3.calls
    got = await rig.cache.get("only-in-l3", at_cosine(RNG, base, 0.998))  # near-exact: conclusive
    assert (got.tier, got.match, text_of(got.entry)) == ("l1", "semantic", "semantic")
    assert rig.l3.calls == calls
    batch = await rig.cache.get_many([Query(key="only-in-l3", embedding=at_cosine(RNG, base, 0.998))])
    assert (batch[0].tier, batch[0].match) == ("l1", "semantic") and rig.l3.calls == calls
    exact = await rig.cache.get("only-in-l3", at_cosine(RNG, base, 0.5))
    assert (exact.tier, exact.match, text_of(exact.entry)) == ("l3", "exact", "exact")


async def test_an_exact_key_in_l3_beats_a_weaker_semantic_hit_in_l1() -> None:
    # Was: the walk stopped at L1's 0.97 candidate (issue 13: the first tier's, not the best).
    rig = make()
    base = unit(RNG, DIM)
    await rig.cache.put(meta("in-l1", base), encode_text("semantic", model="m"))
    rig.l3.rows["only-in-l3"] = stored("only-in-l3", "exact", rig.clock)
    got = await rig.cache.get("only-in-l3", at_cosine(RNG, base, 0.97))
    assert (got.tier, got.match, text_of(got.entry)) == ("l3", "exact", "exact")
    rig.l3.rows["also-in-l3"] = stored("also-in-l3", "exact", rig.clock)
    (batch,) = await rig.cache.get_many([Query(key="also-in-l3", embedding=at_cosine(RNG, base, 0.97))])
    assert (batch.tier, batch.match, text_of(batch.entry)) == ("l3", "exact", "exact")
    no_key = await rig.cache.get(embedding=at_cosine(RNG, base, 0.97))  # nothing better below: L1's
    assert (no_key.tier, no_key.match, no_key.entry.key) == ("l1", "semantic", "in-l1")  # type: ignore[union-attr]


async def test_put_writes_every_tier_and_queues_the_invalidation_twice() -> None:
    rig = make()
    base = unit(RNG, DIM)
    m = meta("k", base, trace_id="t1", similarity_tolerance=0.9)
    result = await rig.cache.put(m, encode_text("v", model="m"))
    assert result.tiers == ("l1", "l2", "l3") and result.persisted
    assert "k" in rig.l3.rows and rig.l3.rows["k"].meta.updated_at_ms == rig.clock()
    (first,) = rig.cache.outbox.take_due()
    assert isinstance(first, CacheInvalidated)
    assert (first.key, first.reason, first.attempt, first.trace_id, first.origin_node_id) == (
        "k",
        "write",
        1,
        "t1",
        "a",
    )
    assert first.similarity_threshold == pytest.approx(0.9)
    assert first.embedding is not None and np.allclose(first.embedding, base, atol=1e-6)
    assert rig.cache.outbox.take_due() == []
    rig.clock.advance(199)
    assert rig.cache.outbox.take_due() == []
    rig.clock.advance(1)
    (second,) = rig.cache.outbox.take_due()
    assert second.attempt == 2 and second.event_id != first.event_id
    assert (second.key, second.embedding, second.occurred_at_ms) == (
        first.key,
        first.embedding,
        first.occurred_at_ms,
    )


async def test_put_drops_similar_local_entries_but_keeps_its_own_and_distant_ones() -> None:
    rig = make()
    base = unit(RNG, DIM)
    await rig.cache.put(meta("close", at_cosine(RNG, base, 0.95)), encode_text("old", model="m"))
    await rig.cache.put(meta("far", at_cosine(RNG, base, 0.5)), encode_text("other", model="m"))
    result = await rig.cache.put(meta("new", base, similarity_tolerance=0.92), encode_text("new", model="m"))
    assert result.invalidated_local == ("close",)
    assert "close" not in rig.cache.l1 and "close" not in rig.cache.l2  # type: ignore[operator]
    assert "far" in rig.cache.l1 and "new" in rig.cache.l1
    assert "close" in rig.l3.rows  # L3 keeps the record; only cached copies go


async def test_invalidation_from_another_node_drops_similar_entries_and_the_stale_key() -> None:
    rig = make(node="b")
    base = unit(RNG, DIM)
    # Strict tolerances, so these three do not invalidate each other on the way in.
    for key, cosine in (("k", 0.99), ("para", 0.93), ("far", 0.3)):
        m = meta(key, at_cosine(RNG, base, cosine), similarity_tolerance=0.999)
        await rig.cache.put(m, encode_text(key, model="m"))
    assert all(k in rig.cache.l1 for k in ("k", "para", "far"))
    rig.clock.advance(10)
    event = CacheInvalidated(
        key="k",
        embedding=base.tolist(),
        similarity_threshold=0.92,
        origin_node_id="a",
        occurred_at_ms=rig.clock(),
    )
    assert rig.cache.on_invalidated(event) == ["k", "para"]
    assert "far" in rig.cache.l1 and "k" not in rig.cache.l1
    assert rig.cache.l2 is not None and "para" not in rig.cache.l2


async def test_invalidation_spares_the_writers_own_entry_and_a_copy_of_this_write_or_newer() -> None:
    base = unit(RNG, DIM)
    writer = make(node="a")
    await writer.cache.put(meta("k", base), encode_text("v", model="m"))
    (own,) = writer.cache.outbox.take_due()
    await writer.cache.put(meta("para", at_cosine(RNG, base, 0.97)), encode_text("p", model="m"))
    # "para" was written after "k" (and dropped "k" locally, but that is this node's own write order)
    assert writer.cache.on_invalidated(own) == ["para"]

    reader = make(node="b")
    reader.clock.ms = own.occurred_at_ms
    await reader.cache.put(meta("k", base), encode_text("same write", model="m"))
    assert reader.cache.on_invalidated(own) == []  # holds this write already (or a newer one)


async def test_a_copy_older_than_a_write_heard_of_is_a_miss_never_a_stale_answer() -> None:
    # Node a's write is still write-behind (its L3 breaker is open), or the row was read before the
    # write landed: L3 and a peer hold the value it replaced. Node b heard of the write: it answers a
    # miss rather than the old value, and places no old copy, until a copy this new turns up.
    rig = make(node="b")
    rig.l3.rows["k"] = stored("k", "old", rig.clock)
    rig.cache.placement.peers = FakePeers({"k": stored("k", "old, on a peer", rig.clock)})
    rig.clock.advance(10)
    rig.cache.on_invalidated(CacheInvalidated(key="k", origin_node_id="a", occurred_at_ms=rig.clock()))
    assert not (await rig.cache.get("k")).hit
    assert not (await rig.cache.get_many([Query(key="k")]))[0].hit
    assert "k" not in rig.cache.l1 and rig.cache.stats()["fenced"] == 2
    rig.cache.placement.peers = None
    rig.l3.rows["k"] = stored("k", "new", rig.clock)  # the write reached L3
    assert text_of((await rig.cache.get("k")).entry) == "new" and "k" in rig.cache.l1


async def test_a_write_after_another_nodes_write_wins_though_this_clock_is_5_s_behind() -> None:
    # Node b's wall clock runs 5 s ahead of a's. b writes k; a hears of it, then writes k itself. Stamped
    # by wall clocks, a's later write would be older than b's: fenced out of a's own memory, refused by
    # L3 (last writer wins by stamp) and ignored by b. Stamped causally, it is the newer one everywhere.
    shared = MemoryL3(clock=Clock())
    a, b = make(node="a", l3=shared), make(node="b", l3=shared)
    b.clock.ms = a.clock() + 5_000
    shared.clock = a.clock
    await b.cache.put(meta("k"), encode_text("b's write", model="m"))
    from_b = b.cache.outbox.take_due()  # the immediate delete (the second one is due later)
    a.cache.on_invalidated(from_b[0])
    result = await a.cache.put(meta("k"), encode_text("a's later write", model="m"))
    assert result.tiers[:1] == ("l1",) and text_of((await a.cache.get("k")).entry) == "a's later write"
    assert text_of(shared.rows["k"]) == "a's later write"
    from_a = [e for e in a.cache.outbox.take_due() if e.attempt == 1]
    assert from_a[0].occurred_at_ms > from_b[0].occurred_at_ms
    assert b.cache.on_invalidated(from_a[0]) == ["k"]  # b's copy is the older one: dropped
    assert text_of((await b.cache.get("k")).entry) == "a's later write"  # from L3, not fenced
    assert a.cache.stats()["clock_ahead_ms"] > 0


async def test_two_nodes_writing_a_key_in_the_same_millisecond_end_with_one_value_everywhere() -> None:
    # Neither has heard of the other's write: both stamp it with the same wall millisecond. With one stamp
    # for two values no node could tell which is newer; each kept its own (CI saw one node serve the
    # other write for good). L3 refuses the second stamp, and that writer stamps again, one past it.
    shared = MemoryL3(clock=Clock())
    a, b = make(node="a", l3=shared), make(node="b", l3=shared)
    b.clock.ms = a.clock()
    await b.cache.put(meta("k"), encode_text("b's write", model="m"))
    result = await a.cache.put(meta("k"), encode_text("a's write", model="m"))
    from_a = [e for e in a.cache.outbox.take_due() if e.attempt == 1]
    from_b = [e for e in b.cache.outbox.take_due() if e.attempt == 1]
    assert result.updated_at_ms == from_b[0].occurred_at_ms + 1 == from_a[0].occurred_at_ms
    assert len(shared.outbox) == 2, "one invalidation per acknowledged write, none for the refused stamp"
    assert (a.cache.stats()["stamps_retaken"], b.cache.stats()["stamps_retaken"]) == (1, 0)
    a.cache.on_invalidated(from_b[0])
    b.cache.on_invalidated(from_a[0])
    values = {text_of((await n.cache.get("k")).entry) for n in (a, b)}
    assert values == {text_of(shared.rows["k"])} == {"a's write"}


async def test_a_node_writing_one_key_twice_in_a_millisecond_stamps_the_second_write_later() -> None:
    rig = make(node="a")
    first = await rig.cache.put(meta("k"), encode_text("first", model="m"))
    second = await rig.cache.put(meta("k"), encode_text("second", model="m"))
    assert second.updated_at_ms == first.updated_at_ms + 1
    held = rig.l3.rows["k"]
    assert text_of(held) == "second" and held.meta.updated_at_ms == second.updated_at_ms


async def test_invalidation_without_embedding_or_with_a_bad_one_drops_the_key_only() -> None:
    rig = make(node="b")
    base = unit(RNG, DIM)
    for key, cosine in (("k", 1.0), ("para", 0.5), ("unrelated", 0.5)):
        await rig.cache.put(meta(key, at_cosine(RNG, base, cosine)), encode_text(key, model="m"))
    rig.clock.advance(5)
    assert rig.cache.on_invalidated(CacheInvalidated(key="k", occurred_at_ms=rig.clock())) == ["k"]
    wrong_dim = CacheInvalidated(
        key="para", embedding=[1.0] * (DIM + 1), similarity_threshold=0.5, occurred_at_ms=rig.clock()
    )
    assert rig.cache.on_invalidated(wrong_dim) == ["para"]


async def test_heat_decisions_evict_refresh_or_keep() -> None:
    rig = make(l1_bytes=3 * 1024, l1_entries=64)
    blob = b"x" * 1000
    for key in ("a", "b"):
        await rig.cache.put(meta(key), encode_text(blob.decode(), model="m"))
    rig.cache.on_heat(HeatScored(key="a", score=0.9, decision="keep_alive"))
    await rig.cache.put(meta("c"), encode_text(blob.decode(), model="m"))  # LRU must now evict b, not a
    assert "a" in rig.cache.l1 and "b" not in rig.cache.l1
    rig.cache.on_heat(HeatScored(key="a", score=0.9, decision="keep"))
    assert "a" in rig.cache.l1
    rig.cache.on_heat(HeatScored(key="a", score=0.01, decision="evict", node_id="other-node"))
    assert "a" in rig.cache.l1
    rig.cache.on_heat(HeatScored(key="a", score=0.01, decision="evict"))
    assert "a" not in rig.cache.l1 and rig.cache.l2 is not None and "a" not in rig.cache.l2
    assert "a" in rig.l3.rows
    assert rig.cache.stats()["heat"] == {"evictions": 1, "keep_alives": 1}


async def test_warmup_and_promotion_load_from_l3_and_eviction_removes() -> None:
    rig = make()
    for key in ("w1", "w2", "p1"):
        rig.l3.rows[key] = stored(key, key, rig.clock)
    warmup = WarmupRequested(keys=["w1", "w2", "missing"])
    report = await rig.cache.on_command(warmup)
    assert report is not None
    assert (report.loaded, report.from_l3, report.missing, report.already_present) == (2, 2, 1, 0)
    assert "w1" in rig.cache.l1 and "w2" in rig.cache.l1
    assert await rig.cache.on_command(warmup) is None, "a redelivered command does nothing twice"
    again = await rig.cache.on_command(WarmupRequested(keys=["w1", "w2"]))
    assert again is not None and (again.loaded, again.already_present) == (0, 2)
    assert await rig.cache.on_command(PromotionRequested(keys=["p1"], node_id="somebody-else")) is None
    to_l2 = await rig.cache.on_command(PromotionRequested(keys=["p1"], node_id="a", to_tier="l2"))
    assert to_l2 is not None and to_l2.loaded == 1
    assert rig.cache.l2 is not None and "p1" in rig.cache.l2 and "p1" not in rig.cache.l1
    up = await rig.cache.on_command(PromotionRequested(keys=["p1"]))  # from L2, no L3 call
    assert up is not None and (up.loaded, up.from_l2, up.from_l3) == (1, 1, 0)
    assert "p1" in rig.cache.l1
    evicted = await rig.cache.on_command(EvictionRequested(keys=["w1", "p1"], node_id="*"))
    assert evicted is not None and evicted.dropped == 2
    assert "w1" not in rig.cache.l1 and "p1" not in rig.cache.l2
    assert set(rig.l3.rows) == {"w1", "w2", "p1"}


async def test_conversation_end_drops_bound_entries_here_and_in_l3() -> None:
    rig = make()
    await rig.cache.put(meta("turn1", trace_id="conv-1"), encode_text("1", model="m"))
    await rig.cache.put(meta("summary", context_dependency_ids=("conv-1",)), encode_text("s", model="m"))
    await rig.cache.put(meta("other", trace_id="conv-2"), encode_text("2", model="m"))
    rig.l3.rows["cold"] = stored("cold", "c", rig.clock, trace_id="conv-1")
    dropped = await rig.cache.on_conversation_ended(ConversationEnded(trace_id="conv-1"))
    assert dropped == ["summary", "turn1"]
    assert "other" in rig.cache.l1 and set(rig.l3.rows) == {"other"}


async def test_breaker_opens_on_slow_l3_then_serves_l1_l2_only_and_writes_behind() -> None:
    rig = make(l3_latency_ms=200, write_behind=True)
    await rig.cache.put(meta("local"), encode_text("here", model="m"))
    for i in range(5):
        assert not (await rig.cache.get(f"miss-{i}")).hit
    assert rig.cache.breaker.state == "open" and rig.cache.degraded
    stats = rig.cache.stats()
    assert stats["degraded"] and "breaker open" in stats["serving"]
    assert stats["l3"]["breaker"]["state"] == "open"
    calls = rig.l3.calls
    rig.l3.rows["only-in-l3"] = stored("only-in-l3", "x", rig.clock)
    skipped = await rig.cache.get("only-in-l3")
    assert not skipped.hit and skipped.degraded and rig.l3.calls == calls
    local = await rig.cache.get("local")
    assert local.hit and local.tier == "l1"
    written = await rig.cache.put(meta("during"), encode_text("d", model="m"))
    assert not written.persisted and written.tiers == ("l1", "l2") and rig.cache.pending_l3_writes == 1
    assert "during" not in rig.l3.rows
    # L3 recovers; after the cooldown one probe closes the breaker and the queued write goes through.
    rig.l3.latency_ms = 2
    rig.clock.advance(1000)
    assert await rig.cache.flush_pending() == 1
    assert (
        rig.cache.breaker.state == "closed" and "during" in rig.l3.rows and rig.cache.pending_l3_writes == 0
    )


async def test_a_durable_write_waits_for_a_slow_l3_the_breaker_keeps_lookups_from() -> None:
    # Open for slowness, the breaker spares lookups the wait; a client waits for its write anyway, and a
    # slow write is still a durable one. A failing L3 is another matter (the test below).
    rig = make(l3_latency_ms=200)
    for i in range(5):
        assert not (await rig.cache.get(f"miss-{i}")).hit
    assert rig.cache.breaker.state == "open" and not rig.cache.breaker.failing
    calls = rig.l3.calls
    assert not (await rig.cache.get("skipped")).hit and rig.l3.calls == calls
    written = await rig.cache.put(meta("slow"), encode_text("s", model="m"))
    assert written.persisted and "slow" in rig.l3.rows
    assert await rig.cache.delete("slow") and "slow" not in rig.l3.rows
    rig.l3.fail = True
    with pytest.raises(L3Unavailable, match="not acknowledged"):
        await rig.cache.put(meta("w"), encode_text("w", model="m"))
    assert rig.cache.breaker.failing
    with pytest.raises(L3Unavailable, match="not acknowledged"):  # refused without waiting now
        await rig.cache.put(meta("w2"), encode_text("w", model="m"))
    assert rig.l3.calls == calls + 3


async def test_failing_l3_degrades_and_the_write_behind_queue_is_bounded() -> None:
    rig = make(l3=MemoryL3(fail=True), max_pending=2, write_behind=True)
    assert (await rig.cache.get("k")).degraded
    for key in ("a", "b"):
        assert not (await rig.cache.put(meta(key), encode_text(key, model="m"))).persisted
    with pytest.raises(L3Unavailable):
        await rig.cache.put(meta("c"), encode_text("c", model="m"))
    assert (await rig.cache.put(meta("a"), encode_text("a2", model="m"))).tiers == ("l1", "l2")  # replaces
    assert rig.cache.stats()["l3"]["errors"] >= 3


async def test_a_node_that_does_not_hear_serves_l3_and_takes_no_write_behind() -> None:
    rig = make(l3=MemoryL3(fail=True), write_behind=True)
    await rig.cache.put(meta("k"), encode_text("local", model="m"))
    rig.cache.placement.hearing_lease_ms, rig.cache.placement.heard_at_ms = 1000, rig.clock()
    assert (await rig.cache.get("k")).tier == "l1"
    rig.clock.advance(1001)  # no fetch answered within the lease: a write elsewhere may be unheard of
    assert not rig.cache.hearing
    late = await rig.cache.get("k")
    assert not late.hit and late.degraded and rig.cache.stats()["unheard_lookups"] == 1
    with pytest.raises(L3Unavailable, match="does not hear"):
        await rig.cache.put(meta("w"), encode_text("w", model="m"))  # no one could be told
    rig.cache.placement.heard_at_ms = rig.clock()
    assert (await rig.cache.get("k")).tier == "l1"
    assert not (await rig.cache.put(meta("w"), encode_text("w", model="m"))).persisted


async def test_durable_by_default_a_write_or_delete_l3_did_not_take_is_refused_not_acknowledged() -> None:
    rig = make()
    assert (await rig.cache.put(meta("k"), encode_text("v", model="m"))).persisted
    rig.cache.outbox.take_due()
    rig.l3.fail = True
    with pytest.raises(L3Unavailable, match="not acknowledged"):
        await rig.cache.put(meta("w"), encode_text("w", model="m"))
    assert rig.cache.pending_l3_writes == 0 and "w" not in rig.l3.rows
    with pytest.raises(L3Unavailable, match="not acknowledged"):
        await rig.cache.delete("k")
    # Not acknowledged, but no node goes on serving what a client asked gone; L3 keeps it until a retry.
    assert "k" not in rig.cache.l1 and "k" in rig.l3.rows and rig.cache.pending_l3_writes == 0
    assert [e.reason for e in rig.cache.outbox.take_due()] == ["delete"]
    rig.l3.fail = False
    rig.clock.advance(10_000)
    assert await rig.cache.delete("k") and "k" not in rig.l3.rows


async def test_an_acknowledged_write_or_delete_leaves_its_invalidation_in_l3s_outbox() -> None:
    # The outbox row is what reaches every node when this one dies before it publishes: the same event
    # (same id, so a receiver ignores the second copy) as the one queued for the broker.
    rig = make()
    await rig.cache.put(meta("k", unit(RNG, DIM)), encode_text("v", model="m"))
    await rig.cache.delete("k")
    queued = [e for e in rig.cache.outbox.take_due() if e.attempt == 1]
    assert [row[0] for row in rig.l3.outbox] == [e.event_id for e in queued]
    assert [e.reason for e in queued] == ["write", "delete"]
    rig.l3.fail = True
    with pytest.raises(L3Unavailable):
        await rig.cache.put(meta("w"), encode_text("w", model="m"))
    assert len(rig.l3.outbox) == 2, "a refused write owes nobody an invalidation"


async def test_an_invalidation_heard_twice_is_applied_once() -> None:
    # The relay sends again what it cannot know was delivered; applied twice, a write's semantic
    # invalidation would drop a neighbour written after it.
    rig = make(node="b")
    v = unit(RNG, DIM)
    event = CacheInvalidated(
        key="q",
        embedding=v.astype(float).tolist(),
        similarity_threshold=0.9,
        origin_node_id="a",
        occurred_at_ms=rig.clock() + 1,
    )
    await rig.cache.put(meta("k", v), encode_text("v", model="m"))
    assert rig.cache.on_invalidated(event) == ["k"]
    rig.clock.advance(5)
    await rig.cache.put(meta("k2", v), encode_text("written after", model="m"))
    assert rig.cache.on_invalidated(event) == [] and "k2" in rig.cache.l1
    assert rig.cache.counters.invalidations_repeated == 1
    fresh = event.model_copy(update={"event_id": new_event_id()})
    assert rig.cache.on_invalidated(fresh) == ["k2"], "another event with the same content still applies"


async def test_delete_goes_everywhere_and_is_published() -> None:
    rig = make()
    await rig.cache.put(meta("k", unit(RNG, DIM)), encode_text("v", model="m"))
    rig.cache.outbox.take_due()
    assert await rig.cache.delete("k")
    assert "k" not in rig.cache.l1 and "k" not in rig.l3.rows
    (event,) = rig.cache.outbox.take_due()
    assert (event.key, event.reason, event.embedding) == ("k", "delete", None)
    assert not await rig.cache.delete("k")


async def test_batched_lookups_mix_tiers_and_kinds() -> None:
    rig = make()
    base = unit(RNG, DIM)
    other = unit(RNG, DIM)
    await rig.cache.put(meta("l1-key"), encode_text("1", model="m"))
    await rig.cache.put(meta("l1-sem", base), encode_text("s", model="m"))
    rig.l3.rows["l3-key"] = stored("l3-key", "3", rig.clock)
    rig.l3.rows["l3-sem"] = stored("l3-sem", "t", rig.clock, other)
    results = await rig.cache.get_many(
        [
            Query(key="l1-key"),
            Query(embedding=at_cosine(RNG, base, 0.97)),
            Query(key="l3-key"),
            Query(embedding=at_cosine(RNG, other, 0.97)),
            Query(key="nope"),
            Query(key="nope", embedding=at_cosine(RNG, base, 0.97)),
        ]
    )
    got = [(r.tier, r.match, text_of(r.entry)) for r in results]
    assert got == [
        ("l1", "exact", "1"),
        ("l1", "semantic", "s"),
        ("l3", "exact", "3"),
        ("l3", "semantic", "t"),
        (None, None, None),
        ("l1", "semantic", "s"),
    ]
    assert "l3-key" in rig.cache.l1 and "l3-sem" in rig.cache.l1


async def test_every_lookup_queues_one_access_record() -> None:
    rig = make()
    await rig.cache.put(meta("k", trace_id="conv"), encode_text("v", model="m"))
    await rig.cache.get("k")
    await rig.cache.get("missing")
    await rig.cache.get(embedding=unit(RNG, DIM))
    hit, miss, emb_miss = rig.cache.outbox.take_access()
    event = hit.event("node-a")
    assert isinstance(event, CacheAccessed)
    assert (event.key, event.hit, event.tier, event.match, event.trace_id, event.node_id) == (
        "k",
        True,
        "l1",
        "exact",
        "conv",
        "node-a",
    )
    assert (miss.key, miss.hit) == ("missing", False)
    assert emb_miss.key.startswith("emb:") and not emb_miss.hit
    assert rig.cache.stats()["lookups"] == 3 and rig.cache.stats()["hits"] == 1


async def test_ttl_expires_in_l1_and_l2_and_l3() -> None:
    rig = make()
    await rig.cache.put(meta("short", ttl_hint_ms=100), encode_text("v", model="m"))
    assert (await rig.cache.get("short")).hit
    rig.clock.advance(100)
    assert rig.cache.expire() == 2
    assert not (await rig.cache.get("short")).hit
    assert await rig.l3.delete_expired(rig.clock()) == 1


async def test_data_l3_refuses_is_an_error_not_an_outage() -> None:
    rig = make(write_behind=True)
    rig.l3.reject.add("bad")
    with pytest.raises(L3Rejected):
        await rig.cache.put(meta("bad"), encode_text("v", model="m"))
    assert rig.cache.breaker.state == "closed" and rig.cache.pending_l3_writes == 0
    assert "bad" not in rig.cache.l1 and rig.cache.outbox.take_due() == []
    # A queued write that L3 later refuses is dropped, not retried forever.
    rig.l3.fail = True
    assert not (await rig.cache.put(meta("bad"), encode_text("v", model="m"))).persisted
    rig.l3.fail = False
    rig.clock.advance(10_000)
    assert await rig.cache.flush_pending() == 1 and rig.cache.pending_l3_writes == 0


async def test_a_peers_l2_answers_before_l3_and_the_hit_is_promoted_here() -> None:
    rig = make()
    peers = FakePeers({"k": stored("k", "from a peer", rig.clock)})
    rig.cache.placement.peers = peers
    rig.l3.rows["k"] = stored("k", "from l3", rig.clock)
    calls = rig.l3.calls
    hit = await rig.cache.get("k")
    assert (hit.tier, hit.match, hit.remote, hit.peer) == ("l2", "exact", True, "10.0.0.2:8701")
    assert text_of(hit.entry) == "from a peer" and rig.l3.calls == calls, "L3 was not asked"
    again = await rig.cache.get("k")
    assert (again.tier, again.remote) == ("l1", False)
    assert rig.cache.l2 is not None and "k" in rig.cache.l2
    stats = rig.cache.stats()
    assert stats["hits_by_tier"]["l2:exact:remote"] == 1 and stats["l2_remote"]["hits"] == 1
    (access,) = [r for r in rig.cache.outbox.take_access() if r.hit][:1]
    assert access.tier == "l2"
    # A miss everywhere near goes on to L3; a semantic-only lookup never asks peers (L2 is exact-key).
    assert (await rig.cache.get("other")).tier is None and peers.asked[-1] == ["other"]
    asked = len(peers.asked)
    await rig.cache.get(embedding=unit(RNG, DIM))
    assert len(peers.asked) == asked


async def test_a_peer_copy_of_another_model_or_expired_is_not_served() -> None:
    rig = make()
    rig.cache.placement.peers = FakePeers(
        {
            "m2": stored("m2", "other model", rig.clock, model="m2"),
            "old": stored("old", "expired", rig.clock, ttl_hint_ms=10),
        }
    )
    assert not (await rig.cache.get("m2", model="m")).hit
    rig.clock.advance(11)
    assert not (await rig.cache.get("old")).hit
    assert rig.cache.stats()["l2_remote"]["rejected"] == 2
    assert "old" not in rig.cache.l1 and "m2" not in rig.cache.l1


async def test_a_broken_peer_port_never_fails_a_lookup() -> None:
    rig = make()
    peers = FakePeers({"k": stored("k", "peer", rig.clock)})
    peers.fail = True
    rig.cache.placement.peers = peers
    rig.l3.rows["k"] = stored("k", "from l3", rig.clock)
    hit = await rig.cache.get("k")
    assert (hit.tier, hit.remote) == ("l3", False)
    assert rig.cache.stats()["l2_remote"]["failures"] == 1


async def test_batched_lookups_and_warmup_ask_peers_once_for_all_local_misses() -> None:
    rig = make()
    peers = FakePeers({f"p{i}": stored(f"p{i}", f"peer {i}", rig.clock) for i in range(3)})
    rig.cache.placement.peers = peers
    rig.l3.rows["l3-only"] = stored("l3-only", "l3", rig.clock)
    await rig.cache.put(meta("local"), encode_text("local", model="m"))
    results = await rig.cache.get_many(
        [
            Query(key="p0"),
            Query(key="local"),
            Query(key="p1"),
            Query(key="l3-only"),
            Query(key="p2", model="x"),
        ]
    )
    assert [(r.tier, r.remote) for r in results] == [
        ("l2", True),
        ("l1", False),
        ("l2", True),
        ("l3", False),
        (None, False),
    ]
    assert peers.asked == [["p0", "p1", "l3-only", "p2"]]
    rig.cache.placement.drop_local("l3-only", "test")
    done = await rig.cache.on_command(WarmupRequested(keys=["p2", "l3-only", "local"], node_id="a"))
    assert done is not None and (done.loaded, done.from_peers, done.from_l3) == (2, 1, 1)
    assert "p2" in rig.cache.l1 and "l3-only" in rig.cache.l1
    assert peers.asked[-1] == ["p2", "l3-only"], "peers first, L3 for the rest"


async def test_forgetting_memory_after_an_outage_empties_l1_and_l2_but_not_l3() -> None:
    rig = make()
    for key in ("a", "b", "c"):
        await rig.cache.put(
            meta(key, unit(RNG, DIM), similarity_tolerance=0.999), encode_text(key, model="m")
        )
    assert rig.cache.l2 is not None and all(k in rig.cache.l1 and k in rig.cache.l2 for k in "abc")
    assert rig.cache.forget_memory("unheard") == 3
    assert len(rig.cache.l1) == 0 and not rig.cache.l2.keys()
    got = await rig.cache.get("b")
    assert (got.hit, got.tier) == (True, "l3")  # the store of record still answers
    assert rig.cache.stats()["forgotten"] == 3
