"""ARC against the claims of Megiddo & Modha (FAST 2003) that can be checked without their traces
(the OLTP trace is not in ../shared/data; the Mooncake reference replay, which LRU and ARC reproduce
to the decimal, is checked by bench/policies.py)."""

from __future__ import annotations

import numpy as np

from policies import ARC, LRU, Policy


def hit_rate(policy: Policy, keys: list[int]) -> float:
    return sum(policy.access(k, t)[0] for t, k in enumerate(keys)) / len(keys)


def oltp_like(seed: int, n: int = 30_000) -> list[int]:
    """A Zipf-skewed working set with occasional long sequential scans, as in OLTP/DB traces."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    scan_base = 1_000_000
    while len(out) < n:
        out += (rng.zipf(1.2, size=500) % 5_000).tolist()
        if rng.random() < 0.3:
            out += list(range(scan_base, scan_base + 400))
            scan_base += 400
    return out[:n]


def test_scan_resistance() -> None:
    """ "ARC is scan-resistant: one-time sequential requests pass through without polluting"."""
    hot = list(range(50)) * 4
    scan = list(range(1000, 1300))
    arc, lru = ARC(100), LRU(100)
    for policy in (arc, lru):
        hit_rate(policy, hot + scan)
    assert all(k in arc for k in range(50))
    assert not any(k in lru for k in range(50))


def test_beats_lru_on_oltp_like_input() -> None:
    for seed in range(3):
        keys = oltp_like(seed)
        for capacity in (250, 1000):
            assert hit_rate(ARC(capacity), keys) >= hit_rate(LRU(capacity), keys)


def test_target_follows_the_workload() -> None:
    arc = ARC(10)
    # Five keys seen twice fill T2; a loop of 8 others then keeps coming back from B1: p rises.
    for t, k in enumerate([0, 1, 2, 3, 4] * 2 + list(range(100, 108)) * 10):
        arc.access(k, t)
    assert arc.p >= 5
    high = arc.p
    for t in range(2000):  # a small frequent set and fresh one-timers: B2 ghost hits lower p
        arc.access(t % 6 if t % 2 else 10_000 + t, t)
    assert arc.p < high
    assert len(arc.t1) + len(arc.b1) <= 10
    assert len(arc) + len(arc.b1) + len(arc.b2) <= 20
