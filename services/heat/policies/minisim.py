"""Miniature simulations that choose the window size of a W-TinyLFU-framed cache.

Reference: Waldspurger et al., "Cache Modeling and Optimization using Miniature Simulations", USENIX
ATC 2017 (spatially sampled shadow caches), used for W-TinyLFU's window by Einziger, Eytan, Friedman,
Manes, "Adaptive Software Cache Management", Middleware 2018. Parameters: shadow W-TinyLFU caches
with fixed windows of 1, 15, 50 and 100% (100% is LRU); keys sampled by hash so that each shadow
holds at most `max_shadow` entries; every `period` sampled requests (256 at first, doubling up to
1,024 or twice the shadow capacity) the shadow with the most hits wins. Hits decay by 7/8 per period
(a memory long enough to see through periodic workloads such as a zigzag scan), and the leader must
beat the current choice by 2% and by more than counting noise (twice the root of the two counts).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from services.heat.policies.sketch import FrequencySketch, stable_hash
from services.heat.policies.tinylfu import WTinyLFU

FRACTIONS: tuple[float, ...] = (0.01, 0.15, 0.5, 1.0)
DECAY = 0.875
MARGIN = 1.02


class WindowTuner:
    def __init__(
        self,
        capacity: int,
        *,
        fractions: tuple[float, ...] = FRACTIONS,
        max_shadow: int = 1024,
        period: int | None = None,
        seed: int = 0,
    ) -> None:
        self.rate = min(1.0, max_shadow / capacity)
        self._threshold = int(self.rate * (1 << 32))
        shadow_capacity = max(1, round(capacity * self.rate))
        self.fractions = fractions
        # The shadows hear the same keys, so one sketch serves them all.
        self.sketch = FrequencySketch(shadow_capacity, seed=seed)
        self.shadows = [
            WTinyLFU(shadow_capacity, window_percent=f, climb=False, seed=seed, sketch=self.sketch)
            for f in fractions
        ]
        self.full_period = period if period is not None else max(1024, 2 * shadow_capacity)
        self.period = min(256, self.full_period)
        self.scores = [0.0] * len(fractions)
        self._hits = [0] * len(fractions)
        self._seen = 0
        self.best = 0
        self.seed = seed

    @property
    def fraction(self) -> float:
        return self.fractions[self.best]

    def record(self, key: Hashable) -> float | None:
        """Replay `key` in the shadows; returns the new window fraction when the choice changes."""
        if self.rate < 1.0 and (stable_hash(key, self.seed + 7) & 0xFFFFFFFF) >= self._threshold:
            return None
        self.sketch.increment(key)
        hits = self._hits
        for i, shadow in enumerate(self.shadows):
            if key in shadow:
                shadow.on_hit(key, 0)
                hits[i] += 1
            else:
                shadow.on_miss(key, 0)
        self._seen += 1
        if self._seen < self.period:
            return None
        self._seen = 0
        self.period = min(2 * self.period, self.full_period)
        self.scores = [DECAY * s + h for s, h in zip(self.scores, hits, strict=True)]
        self._hits = [0] * len(hits)
        leader = max(range(len(self.scores)), key=self.scores.__getitem__)
        lead, current = self.scores[leader], self.scores[self.best]
        # Switch only on a lead that is both relative and beyond counting noise (about 2 sigma).
        if (
            leader != self.best
            and lead > MARGIN * current
            and lead - current > 2.0 * math.sqrt(lead + current)
        ):
            self.best = leader
            return self.fractions[leader]
        return None
