"""The heat frame: W-TinyLFU whose victims are chosen by a heat score, the panel's AI-native expert.

Reference: Einziger et al., "Adaptive Software Cache Management", Middleware 2018 (an LRU window of
`window_percent` (1%) of the capacity in front of a segmented LRU, protected 80%; TinyLFU admission);
docs/design.md §1.2 for the heat. Parameters: the victim is the least hot of the `victim_candidates` (4)
oldest probation entries; a key the doorkeeper has not seen never displaces one of frequency >=
`hot_frequency` (3). The sketch is shared with the owner, which counts every access first. Counts
entries (sizes ignored). How it differs from `wtinylfu.WTinyLFU`: docs/heat.md ("The heat frame").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from policies.adaptive.wtinylfu import PROTECTED_PERCENT, WINDOW_PERCENT
from policies.admission.sketch import FrequencySketch
from policies.admission.tinylfu import TinyLFU
from policies.base import AccessMeta, Eviction, Policy
from policies.learned.features import FEATURES, N_FEATURES, NO_GAP

HeatFn = Callable[[np.ndarray], np.ndarray]

_RECENCY = FEATURES.index("recency")
_INTERVAL = FEATURES.index("interval")
_FREQUENCY = FEATURES.index("frequency")
_HITS = FEATURES.index("hits")
_SIZE = FEATURES.index("size")
_TTL_LEFT = FEATURES.index("ttl_left")
_TRACE_ALIVE = FEATURES.index("trace_alive")
_DYNAMIC = [_RECENCY, _INTERVAL, _FREQUENCY, _HITS]
_LOG64 = math.log(64.0)


def prior_heat(x: np.ndarray, recency_weight: float = 0.5) -> np.ndarray:
    """The fixed heat before the model has learned anything: recent and frequent is hot."""
    return recency_weight * (1.0 - x[:, _RECENCY]) + (1.0 - recency_weight) * x[:, _FREQUENCY]


class HeatFrame(Policy):
    name = "heat-frame"

    def __init__(
        self,
        capacity: int,
        sketch: FrequencySketch,
        heat: HeatFn = prior_heat,
        *,
        window_percent: float = WINDOW_PERCENT,
        victim_candidates: int = 4,
        hot_frequency: int = 3,
        seed: int = 0,
    ) -> None:
        super().__init__(capacity)
        self.sketch = sketch
        self.heat = heat
        self.victim_candidates = victim_candidates
        self.hot_frequency = hot_frequency
        self.window_max = min(capacity, max(1, round(window_percent * capacity)))
        self.protected_max = int(PROTECTED_PERCENT * (capacity - self.window_max))
        self.window: OrderedDict[Hashable, None] = OrderedDict()
        self.probation: OrderedDict[Hashable, None] = OrderedDict()
        self.protected: OrderedDict[Hashable, None] = OrderedDict()
        self._last: dict[Hashable, int] = {}  # resident key -> tick of its last access
        self._gap: dict[Hashable, int] = {}
        self._hits: dict[Hashable, int] = {}
        self._ghost: OrderedDict[Hashable, int] = OrderedDict()  # evicted key -> last tick
        self._tick = 0
        # Heat of the oldest entries, reused for `heat_ttl` accesses: they are the same few keys from
        # one duel to the next, and an untouched entry's heat drifts slowly (recency is logarithmic).
        self.heat_ttl = max(16, capacity // 16)
        self._heat: dict[Hashable, tuple[int, float]] = {}
        self.admission = TinyLFU(sketch, seed=seed)
        self._time_scale = math.log1p(64.0 * max(capacity, 16))
        self._base = np.zeros(N_FEATURES, dtype=np.float32)
        self._base[_SIZE] = math.log1p(1) / math.log1p(max(capacity, 2))
        self._base[_TTL_LEFT] = 1.0
        self._base[_TRACE_ALIVE] = 1.0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._last

    def __len__(self) -> int:
        return len(self._last)

    def invalidate(self) -> None:
        """Forget cached heat (the owner's model changed)."""
        self._heat.clear()

    def _touch(self, key: Hashable, resident: bool) -> None:
        self._tick += 1
        self._heat.pop(key, None)
        last = self._last.get(key) if resident else self._ghost.pop(key, None)
        if last is not None:
            self._gap[key] = self._tick - last
        self._last[key] = self._tick

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self._touch(key, True)
        self._hits[key] = self._hits.get(key, 0) + 1
        if key in self.window:
            self.window.move_to_end(key)
        elif key in self.probation:
            del self.probation[key]
            self.protected[key] = None
            while len(self.protected) > self.protected_max:
                demoted, _ = self.protected.popitem(last=False)
                self.probation[demoted] = None
        else:
            self.protected.move_to_end(key)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        self._touch(key, False)
        self.window[key] = None
        evicted: list[Eviction] = []
        while len(self.window) > self.window_max:
            candidate, _ = self.window.popitem(last=False)
            self.probation[candidate] = None
            if len(self._last) > self.capacity:
                evicted.append(self._duel(candidate))
        while len(self._last) > self.capacity:
            victim = self._victim(exclude=key)
            evicted.append(self._evict(victim if victim is not None else next(iter(self.window))))
        return evicted

    def _duel(self, candidate: Hashable) -> Eviction:
        victim = self._victim(exclude=candidate)
        if victim is None or not self._admit(candidate, victim):
            return self._evict(candidate)
        return self._evict(victim)

    def _admit(self, candidate: Hashable, victim: Hashable) -> bool:
        fc = self.sketch.frequency(candidate)
        fv = self.sketch.frequency(victim)
        if fc <= 1 and fv >= self.hot_frequency:
            return False
        return self.admission.admit_counts(fc, fv)

    def _victim(self, exclude: Hashable) -> Hashable | None:
        """Least heat among the oldest few main-region entries."""
        pool: list[Hashable] = []
        for segment in (self.probation, self.protected):
            for key in segment:
                if key != exclude:
                    pool.append(key)
                    if len(pool) >= self.victim_candidates:
                        break
            if pool:
                break
        if len(pool) <= 1:
            return pool[0] if pool else None
        cache, tick = self._heat, self._tick
        stale = [k for k in pool if k not in cache or tick - cache[k][0] > self.heat_ttl]
        if stale:
            for k, h in zip(stale, self.heat(self.features(stale)).tolist(), strict=True):
                cache[k] = (tick, h)
        return min(pool, key=lambda k: cache[k][1])

    def features(self, keys: list[Hashable]) -> np.ndarray:
        """Rows of `features.FEATURES` for resident `keys`, as far as the frame knows them."""
        ts, tick = self._time_scale, self._tick
        last, gaps, hits, frequency = self._last, self._gap, self._hits, self.sketch.frequency
        rows = []
        for key in keys:
            gap = gaps.get(key, NO_GAP)
            rows.append(
                (
                    min(math.log1p(tick - last[key]) / ts, 1.0),
                    1.0 if gap == NO_GAP else min(math.log1p(gap) / ts, 1.0),
                    frequency(key) / 16.0,
                    min(math.log1p(hits.get(key, 0)) / _LOG64, 1.0),
                )
            )
        x = np.empty((len(keys), N_FEATURES), dtype=np.float32)
        x[:] = self._base
        x[:, _DYNAMIC] = rows
        return x

    def _evict(self, key: Hashable) -> Eviction:
        self.on_remove(key)
        return Eviction(key)

    def on_remove(self, key: Hashable) -> None:
        last = self._last.pop(key, None)
        if last is None:
            return
        self._gap.pop(key, None)
        self._hits.pop(key, None)
        self._heat.pop(key, None)
        self._ghost[key] = last
        if len(self._ghost) > self.capacity:
            self._ghost.popitem(last=False)
        if key in self.window:
            del self.window[key]
        elif key in self.probation:
            del self.probation[key]
        else:
            self.protected.pop(key, None)
