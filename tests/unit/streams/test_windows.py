"""Window boundaries, the mergeable pane aggregate and window statistics."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from schemas.events import CacheAccessed
from streams.windows import (
    ALL_SHARDS,
    HOPPING_10S,
    PANE_MS,
    TUMBLING_1S,
    UNSHARDED,
    PaneAggregate,
    WindowSpec,
    groups_for,
    merge_all,
    pane_start,
    percentile,
    percentiles,
    window_computed,
    window_event_id,
)

T0 = 1_767_225_600_000


def access(ts: int, key: str = "k", hit: bool = True, **kw: object) -> CacheAccessed:
    return CacheAccessed(event_id=f"e{ts}{key}", occurred_at_ms=ts, key=key, hit=hit, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ts", "tumbling", "first_hop", "last_hop"),
    [
        (T0, (T0, T0 + 1000), (T0 - 9000, T0 + 1000), (T0, T0 + 10_000)),
        (T0 + 999, (T0, T0 + 1000), (T0 - 9000, T0 + 1000), (T0, T0 + 10_000)),
        (T0 + 1000, (T0 + 1000, T0 + 2000), (T0 - 8000, T0 + 2000), (T0 + 1000, T0 + 11_000)),
        (T0 + 12_345, (T0 + 12_000, T0 + 13_000), (T0 + 3000, T0 + 13_000), (T0 + 12_000, T0 + 22_000)),
    ],
)
def test_window_boundaries(
    ts: int, tumbling: tuple[int, int], first_hop: tuple[int, int], last_hop: tuple[int, int]
) -> None:
    assert TUMBLING_1S.windows_for(ts) == [tumbling]
    hops = HOPPING_10S.windows_for(ts)
    assert len(hops) == 10
    assert hops[0] == first_hop and hops[-1] == last_hop
    assert all(start <= ts < end for start, end in hops)
    assert all(b[0] - a[0] == 1000 for a, b in itertools.pairwise(hops))


@pytest.mark.parametrize(("ts", "start"), [(0, 0), (999, 0), (1000, 1000), (T0 + 1, T0), (T0 - 1, T0 - 1000)])
def test_pane_start(ts: int, start: int) -> None:
    assert pane_start(ts) == start


def test_windows_near_the_epoch_never_start_before_zero() -> None:
    assert HOPPING_10S.windows_for(2_500) == [(0, 10_000), (1_000, 11_000), (2_000, 12_000)]


def test_hopping_window_is_its_ten_panes() -> None:
    assert list(HOPPING_10S.panes(T0 + 10_000)) == list(range(T0, T0 + 10_000, PANE_MS))
    assert list(TUMBLING_1S.panes(T0 + 1000)) == [T0]


@pytest.mark.parametrize(("size", "step"), [(0, 1000), (1500, 1000), (1000, 0), (10_000, 500)])
def test_window_spec_rejects_sizes_that_are_not_whole_panes(size: int, step: int) -> None:
    with pytest.raises(ValueError):
        WindowSpec("tumbling_1s", size, step)


@pytest.mark.parametrize(
    ("fields", "groups"),
    [
        ({"shard": "s1", "model": "m"}, [("s1", None), (ALL_SHARDS, None), ("s1", "m"), (ALL_SHARDS, "m")]),
        ({"shard": "s1"}, [("s1", None), (ALL_SHARDS, None)]),
        ({}, [(UNSHARDED, None), (ALL_SHARDS, None)]),
    ],
)
def test_every_access_counts_for_its_shard_all_shards_and_its_model(
    fields: dict[str, str], groups: list[object]
) -> None:
    assert groups_for(access(T0, **fields)) == groups


def test_window_statistics_table() -> None:
    agg = PaneAggregate.for_group(("s0", None))
    for a in [
        access(T0 + 1, "a", True, tier="l1", layer="model", latency_ms=1.0),
        access(T0 + 2, "a", False, tier="l1", layer="model", latency_ms=11.0),
        access(T0 + 3, "b", False, tier="l2", layer="sequence", latency_ms=30.0),
        access(T0 + 4, "c", False, tier="l3", layer="token", latency_ms=400.0),
        access(T0 + 5, "c", True, tier="l3", layer="token", latency_ms=5.0),
        access(T0 + 6, "d", True, tier="l2", latency_ms=0.5),
    ]:
        agg.add(a)
    w = window_computed(TUMBLING_1S, ("s0", None), T0, agg)
    assert (w.requests, w.hits, w.distinct_keys, w.penetrated, w.latency_spikes) == (6, 3, 4, 1, 1)
    assert w.qps == 6.0
    assert w.hit_rate == 0.5
    assert w.hit_rate_by_tier == {"l1": 0.5, "l2": 0.5, "l3": 0.5}
    assert w.penetration_by_layer == {"model": 0.5, "sequence": 1.0, "token": 0.5}
    assert w.added_latency_ms_by_layer == {"model": 10.0, "sequence": 30.0, "token": 395.0}
    assert (w.miss_latency_ms_p50, w.miss_latency_ms_p95) == (30.0, 400.0)
    assert w.entropy_bits == pytest.approx(-(2 * (2 / 6) * math.log2(2 / 6) + 2 * (1 / 6) * math.log2(1 / 6)))
    assert w.window_start_ms == T0 and w.window_end_ms == T0 + 1000 and w.occurred_at_ms == T0 + 1000
    hop = window_computed(HOPPING_10S, ("s0", None), T0 - 9000, agg)
    assert hop.qps == 0.6 and hop.requests == 6
    assert w.event_id == window_event_id(TUMBLING_1S, ("s0", None), T0) != hop.event_id


def test_merging_partial_aggregates_in_any_order_gives_the_same_counts() -> None:
    rng = random.Random(11)
    events = [
        access(
            T0 + n,
            f"k{rng.randint(0, 30)}",
            rng.random() < 0.5,
            tier=rng.choice(["l1", "l2"]),
            layer=rng.choice([None, "model", "token"]),
            latency_ms=float(rng.randint(0, 500)),
            service=f"svc{rng.randint(0, 3)}",
            call_depth=rng.randint(0, 4),
        )
        for n in range(400)
    ]
    whole = PaneAggregate.for_group(("s0", None))
    for e in events:
        whole.add(e)
    parts = [PaneAggregate.for_group(("s0", None)) for _ in range(4)]
    for e in events:
        parts[rng.randrange(4)].add(e)
    rng.shuffle(parts)
    merged = merge_all(PaneAggregate.from_json(p.to_json()) for p in parts)
    assert merged.keys == whole.keys
    assert (merged.requests, merged.hits, merged.penetrated, merged.spikes) == (
        whole.requests,
        whole.hits,
        whole.penetrated,
        whole.spikes,
    )
    assert merged.tiers == whole.tiers
    assert sorted(merged.miss_latencies_ms) == sorted(whole.miss_latencies_ms)
    assert merged.activity is not None and whole.activity is not None
    assert {k: a.to_json() for k, a in merged.activity.items()} == {
        k: a.to_json() for k, a in whole.activity.items()
    }
    a = window_computed(HOPPING_10S, ("s0", None), T0, merged)
    b = window_computed(HOPPING_10S, ("s0", None), T0, whole)
    assert a.entropy_bits == b.entropy_bits and a.miss_latency_ms_p95 == b.miss_latency_ms_p95


def test_a_json_snapshot_does_not_change_with_the_live_aggregate() -> None:
    agg = PaneAggregate.for_group(("s0", None))
    agg.add(access(T0, "a", False, tier="l1"))
    snapshot = agg.to_json()
    agg.add(access(T0 + 1, "a", False, tier="l1"))
    assert snapshot["k"] == {"a": 1} and snapshot["t"] == {"l1": [1, 0]} and len(snapshot["m"]) == 1


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([5.0], 95, 5.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([1.0, 2.0, 3.0, 4.0], 95, 4.0)],
)
def test_nearest_rank_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


@pytest.mark.parametrize("n", [0, 1, 2, 5, 63, 64, 65, 200, 1_001])
def test_percentiles_of_unsorted_values_are_the_nearest_ranks_of_the_sorted_ones(n: int) -> None:
    rng = random.Random(n)
    # Few distinct values too: ties must select the same value as the sort.
    for values in ([rng.uniform(0, 500) for _ in range(n)], [float(rng.randint(0, 3)) for _ in range(n)]):
        qs = (50, 95, 99, 1, 100)
        assert percentiles(values, qs) == [percentile(sorted(values), q) for q in qs]


def test_sliding_keys_equal_a_fresh_merge_of_the_panes_in_the_window() -> None:
    """Panes enter and leave a sliding window (one rebuilt on the way): the kept counts equal merging
    the window's panes from scratch, and a key whose count drops to zero leaves."""
    import random

    from streams.windows import SlidingKeys

    rng = random.Random(3)
    panes = {
        s: {f"k{rng.randint(0, 30)}": rng.randint(1, 4) for _ in range(20)} for s in range(0, 30_000, 1_000)
    }
    sliding = SlidingKeys()
    for end in range(1_000, 31_000, 1_000):
        window = {s: panes[s] for s in range(end - 10_000, end, 1_000) if s in panes and rng.random() < 0.9}
        if end == 15_000:  # a pane rebuilt (a re-sent partial): the new dict replaces the old one
            panes[12_000] = dict(panes[12_000])
            panes[12_000]["k-new"] = 2
            window[12_000] = panes[12_000]
        expected: dict[str, int] = {}
        for keys in window.values():
            for key, n in keys.items():
                expected[key] = expected.get(key, 0) + n
        assert sliding.slide(window) == expected
    assert sliding.slide({}) == {}


def _pane(accesses: list[CacheAccessed]) -> PaneAggregate:
    agg = PaneAggregate.for_group(("s0", None))
    for a in accesses:
        agg.add(a)
    return agg


@pytest.mark.parametrize("overlap", [False, True])
def test_merging_partials_leaves_them_unchanged_and_sums_every_key(overlap: bool) -> None:
    """A pane's partials usually have disjoint keys (a key counts in one source partition) and are taken
    over as a union; where keys meet, the sum is new. Either way the partials stay as they were, and
    merging again from them gives the same result."""
    first = _pane([access(T0 + i, f"a{i % 3}", i % 2 == 0, service="x", call_depth=i) for i in range(6)])
    shared = "a0" if overlap else "b0"
    second = _pane([access(T0 + 10 + i, k, False, service="y") for i, k in enumerate([shared, "b1", shared])])
    before = (first.to_json(), second.to_json())
    merged = merge_all([first, second])
    assert (first.to_json(), second.to_json()) == before
    assert merged.keys == {
        **{f"a{i}": 2 for i in range(3)},
        **{"b1": 1},
        **({"a0": 4} if overlap else {"b0": 2}),
    }
    assert merged.activity is not None
    if overlap:
        a0 = merged.activity["a0"]
        assert (a0.count, a0.first_ms, a0.last_ms, a0.services) == (4, T0, T0 + 12, {"x", "y"})
    # The merged pane changing later (the same keys merged into it again) reaches no partial either.
    once = merged.to_json()
    merged.merge(second)
    assert (first.to_json(), second.to_json()) == before
    assert merge_all([first, second]).to_json() == once
