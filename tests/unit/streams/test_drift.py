"""Drift features, DBSCAN with eps from the window's spread, and pulse / migrating / stable labels
(docs/design.md §2.4), on planted patterns."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from infra.generator import merge_by_time, migration_events, pulse_events
from schemas.events import CacheAccessed
from streams.drift import (
    DriftParams,
    KeyWindow,
    advance_runs,
    burst_variance,
    cluster_window,
    eps_from_spread,
    features,
    label,
)
from streams.offline import offline_drift

T0 = 1_767_225_600_000
P = DriftParams()


def test_features_are_the_seed_vector() -> None:
    k = KeyWindow(
        "k", count=9, last_ms=T0 - 10_000, depth=3, services=frozenset(), active_since_ms=T0, pane_counts=()
    )
    (row,) = features([k], T0)
    assert row.tolist() == pytest.approx([math.log1p(9), math.exp(-1.0), 3.0])


@pytest.mark.parametrize(
    ("duration_s", "variance", "spread", "accesses", "pattern"),
    [
        (1, 9.0, 0.10, 30, "pulse"),
        (7.9, 1.0, 0.14, 5, "pulse"),
        (8, 9.0, 0.10, 30, "stable"),  # too long for a pulse
        (1, 0.9, 0.10, 30, "stable"),  # not bursty
        (1, 9.0, 0.15, 30, "stable"),  # too widely spread
        (1, 9.0, 0.10, 2, "stable"),  # cold keys
        (30, 0.0, 0.70, 20, "migrating"),
        (120, 0.5, 1.00, 20, "migrating"),
        (29.9, 0.0, 0.90, 20, "stable"),  # not yet long enough
        (121, 0.0, 0.90, 20, "stable"),  # settled: the new normal
        (60, 1.0, 0.90, 20, "stable"),  # bursty, not migrating
        (60, 0.0, 0.65, 20, "stable"),  # not spread enough
    ],
)
def test_label_table(duration_s: float, variance: float, spread: float, accesses: int, pattern: str) -> None:
    assert label(round(duration_s * 1000), variance, spread, P, accesses) == pattern


@pytest.mark.parametrize(
    ("totals", "variance"),
    [
        ([], 0.0),
        ([0, 0, 0], 0.0),
        ([5, 5, 5, 5], 0.0),
        ([0] * 9 + [10], 9.0),
        ([0] * 5 + [4] * 5, 1.0),
        ([0, 0, 0, 6, 6, 6, 6, 6, 6, 6], 3 / 7),
    ],
)
def test_burst_variance_is_squared_coefficient_of_variation(totals: list[int], variance: float) -> None:
    assert burst_variance(totals) == pytest.approx(variance)


def test_eps_follows_the_window_spread() -> None:
    x = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    assert eps_from_spread(x, 0.5, 0.01) == pytest.approx(0.5)  # RMS distance to centroid is 1
    assert eps_from_spread(x * 10, 0.5, 0.01) == pytest.approx(5.0)
    assert eps_from_spread(np.zeros((3, 3)), 0.5, 0.01) == 0.01
    assert eps_from_spread(np.empty((0, 3)), 0.5, 0.01) == 0.01


def test_activity_runs_carry_over_start_and_end() -> None:
    runs, started, ended = advance_runs({"a": 100, "b": 200}, {"a": 5_000, "c": 5_500})
    assert runs == {"a": 100, "c": 5_500} and started == {"c": 5_500} and ended == ["b"]


def _key(
    name: str, count: int, depth: int, services: set[str], since: int, panes: tuple[int, ...]
) -> KeyWindow:
    return KeyWindow(name, count, T0 - 100, depth, frozenset(services), since, panes)


def test_dbscan_separates_a_planted_pulse_and_migration_from_background() -> None:
    rng = random.Random(5)
    keys = [
        _key(
            f"bg{n}",
            rng.randint(1, 3),
            rng.randint(1, 3),
            {f"svc-{rng.randint(0, 7)}"},
            T0 - 4_000,
            (1,) * 10,
        )
        for n in range(200)
    ]
    keys += [_key(f"pulse{n}", 30, 6, {"svc-pulse"}, T0 - 900, (0,) * 9 + (30,)) for n in range(12)]
    keys += [
        _key(f"migr{n}", 20, 4, {f"svc-{(n + i) % 8}" for i in range(3)}, T0 - 45_000, (2,) * 10)
        for n in range(12)
    ]
    clusters = cluster_window(keys, T0, P)
    by_key = {k: c for c in clusters for k in c.keys}
    assert {by_key[f"pulse{n}"].pattern for n in range(12)} == {"pulse"}
    assert {by_key[f"migr{n}"].pattern for n in range(12)} == {"migrating"}
    pulse, migr = by_key["pulse0"], by_key["migr0"]
    assert set(pulse.keys) == {f"pulse{n}" for n in range(12)} and set(migr.keys) == {
        f"migr{n}" for n in range(12)
    }
    assert (
        pulse.duration_ms == 900
        and pulse.variance == pytest.approx(9.0)
        and pulse.service_spread == pytest.approx(1 / 9)
    )
    assert migr.duration_ms == 45_000 and migr.variance == 0.0 and migr.service_spread == pytest.approx(8 / 9)
    assert all(c.pattern == "stable" for c in clusters if c not in (pulse, migr))


def test_too_few_keys_make_no_clusters() -> None:
    assert cluster_window([_key("a", 5, 1, set(), T0, (5,))], T0, P) == []


def _background(until_ms: int) -> list[CacheAccessed]:
    rng = random.Random(9)
    return [
        CacheAccessed(
            event_id=f"bg{n}",
            occurred_at_ms=T0 + n * 25,
            key=f"bg{rng.randint(0, 400)}",
            hit=True,
            shard="s0",
            service=f"svc-{n % 8}",
            call_depth=1 + n % 3,
        )
        for n in range(until_ms // 25)
    ]


def test_planted_pulse_and_migration_are_labelled_within_two_windows() -> None:
    pulse_at, migration_at = T0 + 40_000, T0 + 5_000
    events = [
        e
        for e in merge_by_time(_background(60_000), migration_events(migration_at), pulse_events(pulse_at))
        if isinstance(e, CacheAccessed)
    ]
    clusters = offline_drift(events)

    def first(pattern: str, prefix: str) -> int:
        return min(
            c.window_end_ms
            for c in clusters
            if c.pattern == pattern and sum(k.startswith(prefix) for k in c.keys) >= 10
        )

    # The first window holding the pulse ends at pulse_at + 1 s; the migration can first be called
    # one once its keys have been active for 30 s.
    assert first("pulse", "pulse:") <= pulse_at + 2_000
    assert first("migrating", "migr:") <= migration_at + 30_000 + 2_000
    for c in clusters:
        if any(k.startswith("pulse:") for k in c.keys):
            assert c.pattern != "migrating"
        if any(k.startswith("migr:") for k in c.keys):
            assert c.pattern != "pulse"
        if all(k.startswith("bg") for k in c.keys):
            assert c.pattern == "stable"


def test_vectorised_window_keys_equal_the_per_key_walk_also_when_service_names_run_out() -> None:
    """`window_keys` over pane columns gives the same rows, in the same order, as the per-key walk;
    more distinct services than the bits hold resets them, and a window beyond even that takes the
    walk."""
    import random

    from schemas.events import CacheAccessed
    from streams.merge import ServiceBits, pane_columns, window_keys
    from streams.windows import PaneAggregate

    rng = random.Random(11)

    def pane(start: int, services: int) -> PaneAggregate:
        agg = PaneAggregate(activity={})
        for n in range(60):
            agg.add(
                CacheAccessed(
                    key=f"k{rng.randint(0, 40)}",
                    hit=True,
                    occurred_at_ms=start + rng.randint(0, 999),
                    call_depth=rng.randint(0, 4),
                    service=f"svc-{rng.randint(0, services - 1)}" if n % 7 else None,
                )
            )
        return agg

    bits = ServiceBits()
    for services in (3, 40, 200):
        panes = [None if i == 4 else pane(i * 1_000, services) for i in range(10)]
        columns = [None if p is None else pane_columns(p, bits) for p in panes]
        if any(c is None for c, p in zip(columns, panes, strict=True) if p is not None):
            bits.reset()
            columns = [None if p is None else pane_columns(p, bits) for p in panes]
        walked, walked_first = window_keys(panes)
        if services > ServiceBits.LIMIT:
            assert any(c is None for c, p in zip(columns, panes, strict=True) if p is not None)
            continue
        fast, fast_first = window_keys(panes, columns, bits)
        assert fast.keys == walked.keys and fast_first == walked_first
        for name in ("count", "last_ms", "depth", "active_since_ms", "pane_counts"):
            assert np.array_equal(getattr(fast, name), getattr(walked, name)), name
        assert fast.services == walked.services
