"""The Mooncake replay: deterministic, in time order, prefix-cache hits, the three-layer cascade."""

from __future__ import annotations

from infra.generator import (
    MooncakeReplay,
    MooncakeRequest,
    ReplayConfig,
    merge_by_time,
    migration_events,
    mooncake_events,
    pulse_events,
)
from schemas.events import CacheAccessed, KvBlockStored


def _blocks(events: list[object]) -> list[tuple[str, bool]]:
    return [(e.key, e.hit) for e in events if isinstance(e, CacheAccessed) and e.kind == "kv_block"]


def test_prefix_cache_replay_hits_the_longest_resident_prefix() -> None:
    replay = MooncakeReplay(ReplayConfig(cascade=False))
    first = replay.request_events(MooncakeRequest(0, 1024, 1, (1, 2)))
    second = replay.request_events(MooncakeRequest(10, 2048, 1, (1, 2, 3, 4)))
    third = replay.request_events(MooncakeRequest(20, 1024, 1, (9, 2)))
    assert _blocks(first) == [("block:1", False), ("block:2", False)]
    assert _blocks(second) == [("block:1", True), ("block:2", True), ("block:3", False), ("block:4", False)]
    # Block 2 is resident but its prefix (9) is not: prefix caching cannot use it.
    assert _blocks(third) == [("block:9", False), ("block:2", False)]


def test_the_cascade_goes_down_a_layer_only_on_a_miss() -> None:
    replay = MooncakeReplay(ReplayConfig(per_block=False))
    cold = replay.request_events(MooncakeRequest(0, 40_000, 1, (5, 6)))
    layers = [(e.layer, e.hit) for e in cold if isinstance(e, CacheAccessed)]
    assert layers == [("model", False), ("sequence", False), ("token", False)]
    stored = [e for e in cold if isinstance(e, KvBlockStored)]
    assert len(stored) == 1 and stored[0].occurred_at_ms > cold[0].occurred_at_ms
    token = next(e for e in cold if isinstance(e, CacheAccessed) and e.layer == "token")
    assert token.latency_ms > 320  # a 40k-token prefill is a spike
    again = replay.request_events(MooncakeRequest(5, 40_000, 1, (5, 6)))
    assert [(e.layer, e.hit) for e in again if isinstance(e, CacheAccessed)] == [("model", True)]
    sibling = replay.request_events(MooncakeRequest(9, 39_000, 1, (5, 7)))
    assert [(e.layer, e.hit) for e in sibling if isinstance(e, CacheAccessed)] == [
        ("model", False),
        ("sequence", True),
    ]


def test_the_replay_is_deterministic_and_in_time_order() -> None:
    a = mooncake_events(until_ms=20_000)
    b = mooncake_events(until_ms=20_000)
    assert a == b and len(a) > 1_000
    assert [e.occurred_at_ms for e in a] == sorted(e.occurred_at_ms for e in a)
    assert len({e.event_id for e in a}) == len(a)
    shards = {e.shard for e in a if isinstance(e, CacheAccessed)}
    assert shards == {"s0", "s1", "s2", "s3"}


def test_planted_patterns_have_their_shape() -> None:
    pulse = pulse_events(1_000, keys=3, duration_ms=2_000, per_key_per_s=5)
    assert len(pulse) == 3 * 10 and {e.service for e in pulse} == {"svc-pulse"}
    migration = migration_events(0, keys=4, duration_ms=10_000, per_key_per_s=2)
    assert {e.service for e in migration if e.key == "migr:0"} == {f"svc-{n}" for n in range(8)}
    merged = merge_by_time(pulse, migration)
    assert len(merged) == len(pulse) + len(migration)
    assert [e.occurred_at_ms for e in merged] == sorted(e.occurred_at_ms for e in merged)
