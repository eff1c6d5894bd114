"""TinyLFU admission (Einziger, Friedman, Manes, ACM ToS 2017; Caffeine's `BoundedLocalCache`): a
candidate replaces a victim only when the frequency sketch says it is asked for more often. A 1/128
random admission for candidates with frequency >= 6 defeats hash flooding (Caffeine's guard).

Eviction policies that admit (W-TinyLFU, the heat frame) own one `TinyLFU` and ask it at each duel.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

from policies.admission.sketch import FrequencySketch

HASHDOS_THRESHOLD = 6


class TinyLFU:
    """The admission duel over a shared `FrequencySketch`; `rng` decides the hash-flooding escape."""

    def __init__(self, sketch: FrequencySketch, *, seed: int = 0) -> None:
        self.sketch = sketch
        self._rng = random.Random(seed)

    def admit(self, candidate: Hashable, victim: Hashable) -> bool:
        return self.admit_counts(self.sketch.frequency(candidate), self.sketch.frequency(victim))

    def admit_counts(self, candidate_freq: int, victim_freq: int) -> bool:
        """The duel on frequencies already read (callers that also look at them themselves)."""
        if candidate_freq > victim_freq:
            return True
        return candidate_freq >= HASHDOS_THRESHOLD and self._rng.getrandbits(7) == 0
