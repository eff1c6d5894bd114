from __future__ import annotations

import numpy as np

from policies import make_policy
from sim.burst import (
    BurstScenario,
    burst_metrics,
    burst_trace,
    requests_to_residency,
    zipf_probabilities,
)
from sim.replay import replay

TINY = BurstScenario(keys=300, capacity=30, requests=6000, shift_at=3000, moved=10, window=200)


def test_zipf_probabilities() -> None:
    p = zipf_probabilities(100, 0.9)
    assert abs(p.sum() - 1.0) < 1e-12 and np.all(np.diff(p) < 0)


def test_hot_ranks_move_to_never_seen_keys_at_the_shift() -> None:
    trace, new_keys = burst_trace(TINY)
    keys = trace.keys
    before, after = keys[: TINY.shift_at], keys[TINY.shift_at :]
    assert set(new_keys.tolist()).isdisjoint(before.tolist())
    assert set(new_keys.tolist()) & set(after.tolist())
    assert not set(range(TINY.moved)) & set(after.tolist())  # the old hot keys vanish
    assert np.array_equal(burst_trace(TINY)[0].keys, keys)


def test_requests_to_residency_is_the_position_of_the_last_miss() -> None:
    keys = np.array([5, 1, 5, 5, 2, 5])
    hits = np.array([False, False, False, True, False, True])
    assert requests_to_residency(keys, hits, 5, 0) == 2
    assert requests_to_residency(keys, hits, 5, 3) == 0
    assert requests_to_residency(keys, hits, 9, 0) is None


def test_metrics_for_lru_and_opt() -> None:
    trace, new_keys = burst_trace(TINY)
    out = {}
    for name in ("lru", "opt"):
        result = replay(trace, make_policy(name, TINY.capacity, future=trace.keys), record=True)
        assert result.hit_mask is not None
        out[name] = burst_metrics(name, trace, new_keys, result.hit_mask, TINY)
    lru, opt = out["lru"], out["opt"]
    assert opt.pre_hit_rate >= lru.pre_hit_rate
    assert 0 <= lru.min_hit_rate <= lru.pre_hit_rate
    assert lru.pre_hit_rate_warm >= lru.pre_hit_rate
    assert lru.dip == lru.pre_hit_rate - lru.min_hit_rate
    assert 0.0 <= opt.resident_within_3 <= 1.0
    assert lru.residency_median >= 1
