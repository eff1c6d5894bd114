"""The burst experiment of docs/design.md §2.2: a Zipf workload whose hottest ranks jump to never-seen keys.

Scenario, as the source describes it: Zipf(0.9) over 10,000 keys, capacity 500, 200,000 requests; at
request 100,000 the 100 hottest ranks move to new keys. Metrics, per policy, from its hit mask:
- requests to residency: for each new hot key, how many of its own requests it needs until it
  stays resident (the position of its last miss; 1 means only the compulsory miss);
- the dip: steady pre-shift hit rate (mean of the 1,000-request windows in the second half of the
  first phase) minus the worst post-shift window, with compulsory misses counted and with them
  removed from each window's denominator;
- recovery: requests after the shift until a window reaches 95% of the pre-shift hit rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.replay import compulsory_mask
from sim.traces import Trace, from_keys


@dataclass(frozen=True)
class BurstScenario:
    keys: int = 10_000
    alpha: float = 0.9
    capacity: int = 500
    requests: int = 200_000
    shift_at: int = 100_000
    moved: int = 100
    window: int = 1_000
    recovery_fraction: float = 0.95
    seed: int = 0


@dataclass(frozen=True)
class BurstResult:
    policy: str
    hit_rate: float
    pre_hit_rate: float
    min_hit_rate: float
    dip: float
    pre_hit_rate_warm: float
    min_hit_rate_warm: float
    dip_warm: float
    recovery_requests: int | None
    residency_median: float
    residency_p90: float
    residency_max: int
    resident_within_3: float


def zipf_probabilities(n: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** alpha
    return weights / weights.sum()


def burst_trace(scenario: BurstScenario) -> tuple[Trace, np.ndarray]:
    """The request keys and the never-seen keys that take over the hottest ranks at the shift.

    Rank r (0 = hottest) is key r before the shift; after it, ranks below `moved` are keys
    `keys + r`, so the old hot keys are never asked for again.
    """
    rng = np.random.default_rng(scenario.seed)
    ranks = rng.choice(
        scenario.keys, size=scenario.requests, p=zipf_probabilities(scenario.keys, scenario.alpha)
    )
    keys = ranks.astype(np.int64)
    after = np.arange(scenario.requests) >= scenario.shift_at
    moved = after & (ranks < scenario.moved)
    keys[moved] = scenario.keys + ranks[moved]
    new_keys = scenario.keys + np.arange(scenario.moved, dtype=np.int64)
    return from_keys("burst", keys), new_keys


def requests_to_residency(keys: np.ndarray, hits: np.ndarray, key: int, start: int) -> int | None:
    """How many of `key`'s requests from `start` on it needs until it never misses again."""
    own = np.nonzero(keys[start:] == key)[0]
    if len(own) == 0:
        return None
    misses = np.nonzero(~hits[start:][own])[0]
    return int(misses[-1]) + 1 if len(misses) else 0


def burst_metrics(
    policy: str, trace: Trace, new_keys: np.ndarray, hits: np.ndarray, scenario: BurstScenario
) -> BurstResult:
    w = scenario.window
    n = (len(trace) // w) * w
    per_window = hits[:n].reshape(-1, w).sum(axis=1)
    compulsory = compulsory_mask(trace.keys)[:n].reshape(-1, w).sum(axis=1)
    rate = per_window / w
    warm = per_window / np.maximum(w - compulsory, 1)
    shift = scenario.shift_at // w
    steady = slice(shift // 2, shift)
    pre, pre_warm = float(rate[steady].mean()), float(warm[steady].mean())
    post, post_warm = rate[shift:], warm[shift:]
    recovered = np.nonzero(post >= scenario.recovery_fraction * pre)[0]
    recovery = int((recovered[0] + 1) * w) if len(recovered) else None
    residency = [
        r
        for r in (requests_to_residency(trace.keys, hits, int(k), scenario.shift_at) for k in new_keys)
        if r is not None
    ]
    res = np.asarray(residency if residency else [0])
    return BurstResult(
        policy=policy,
        hit_rate=float(hits.mean()),
        pre_hit_rate=pre,
        min_hit_rate=float(post.min()),
        dip=pre - float(post.min()),
        pre_hit_rate_warm=pre_warm,
        min_hit_rate_warm=float(post_warm.min()),
        dip_warm=pre_warm - float(post_warm.min()),
        recovery_requests=recovery,
        residency_median=float(np.median(res)),
        residency_p90=float(np.percentile(res, 90)),
        residency_max=int(res.max()),
        resident_within_3=float((res <= 3).mean()),
    )
