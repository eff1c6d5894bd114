"""The heat frame: W-TinyLFU whose victim among the oldest probation entries is the coldest by a
heat function, with TinyLFU admission and the one-hit-wonder guard."""

from __future__ import annotations

import numpy as np

from policies.admission.sketch import FrequencySketch
from policies.learned.features import FEATURES
from policies.learned.frame import HeatFrame, prior_heat

HITS = FEATURES.index("hits")


def frame(capacity: int, heat=prior_heat) -> HeatFrame:  # type: ignore[no-untyped-def]
    return HeatFrame(capacity, FrequencySketch(capacity), heat)


def access(policy: HeatFrame, key: int, t: int) -> list[object]:
    policy.sketch.increment(key)  # the owner counts every access before the frame hears it
    _, out = policy.access(key, t)
    return [e.key for e in out]


def test_the_victim_is_the_coldest_of_the_oldest_candidates() -> None:
    policy = frame(10, heat=lambda x: x[:, HITS])  # heat = hits while resident
    for t, key in enumerate(range(10)):
        access(policy, key, t)
    assert list(policy.probation)[:4] == [0, 1, 2, 3]
    for key in (0, 1, 3):
        policy._hits[key] = 5
    assert policy._victim(exclude=None) == 2  # the coldest of the four oldest, not the oldest
    policy._hits[2] = 9
    policy.invalidate()
    assert policy._victim(exclude=None) == 0  # ties go to the oldest


def test_one_hit_wonders_cannot_displace_hot_entries() -> None:
    policy = frame(20)
    t = 0
    for _ in range(5):
        for key in range(15):
            access(policy, key, t)
            t += 1
    for wonder in range(1000, 1300):
        access(policy, wonder, t)
        t += 1
    assert all(key in policy for key in range(15))
    assert len(policy) <= 20


def test_heat_is_scored_on_frame_features() -> None:
    seen: list[np.ndarray] = []

    def heat(x: np.ndarray) -> np.ndarray:
        seen.append(x.copy())
        return prior_heat(x)

    policy = frame(8, heat=heat)
    for t, key in enumerate(list(range(8)) + list(range(8)) + list(range(100, 140))):
        access(policy, key, t)
    assert seen and all(x.shape[1] == len(FEATURES) for x in seen)
    assert all(((x >= 0) & (x <= 1)).all() for x in seen)
