"""W-TinyLFU as Caffeine does it, counting entries (sizes are ignored).

Reference: Einziger, Eytan, Friedman, Manes, "Adaptive Software Cache Management", Middleware 2018,
and Caffeine's `BoundedLocalCache`. New keys enter an LRU window (1% of capacity); a key leaving the
window duels the main region's victim and is admitted only if the sketch says it is more frequent
(TinyLFU admission, `policies/admission`). The main region is a segmented LRU: probation (20%)
and protected (80%). A hill climber resizes the window every `10 * capacity` requests: step 6.25%
of capacity, restart when the hit rate moves by >= 5 points, otherwise the step decays by 0.98
and follows the sign of the last gain.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.admission import FrequencySketch, TinyLFU
from policies.base import AccessMeta, Eviction, Policy

WINDOW_PERCENT = 0.01
PROTECTED_PERCENT = 0.80
STEP_PERCENT = 0.0625
RESTART_THRESHOLD = 0.05
STEP_DECAY = 0.98


class HillClimber:
    """Caffeine's simple hill climber over the window size; `record` returns the adjustment."""

    def __init__(self, capacity: int, sample_size: int) -> None:
        self.capacity = capacity
        self.sample_size = sample_size
        self.step = -STEP_PERCENT * capacity
        self.previous_hit_rate = 0.0
        self.hits = 0
        self.misses = 0

    def record(self, hit: bool) -> int:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        requests = self.hits + self.misses
        if requests < self.sample_size:
            return 0
        hit_rate = self.hits / requests
        change = hit_rate - self.previous_hit_rate
        amount = self.step if change >= 0 else -self.step
        if abs(change) >= RESTART_THRESHOLD:
            self.step = STEP_PERCENT * self.capacity * (1 if amount >= 0 else -1)
        else:
            self.step = STEP_DECAY * amount
        self.previous_hit_rate = hit_rate
        self.hits = self.misses = 0
        return int(amount)


class WTinyLFU(Policy):
    name = "wtinylfu"

    def __init__(
        self,
        capacity: int,
        *,
        window_percent: float = WINDOW_PERCENT,
        climb: bool = True,
        doorkeeper: bool = True,
        seed: int = 0,
        sketch: FrequencySketch | None = None,
    ) -> None:
        super().__init__(capacity)
        # A shared `sketch` is counted by its owner (miniature simulations share one).
        self._counts = sketch is None
        self.sketch = (
            sketch if sketch is not None else FrequencySketch(capacity, doorkeeper=doorkeeper, seed=seed)
        )
        self.window_max = min(capacity, max(1, round(window_percent * capacity)))
        self._set_main(capacity - self.window_max)
        self.window: OrderedDict[Hashable, None] = OrderedDict()
        self.probation: OrderedDict[Hashable, None] = OrderedDict()
        self.protected: OrderedDict[Hashable, None] = OrderedDict()
        self.climber = HillClimber(capacity, self.sketch.sample_size) if climb else None
        self.admission = TinyLFU(self.sketch, seed=seed)
        self._n = 0

    def _set_main(self, main_max: int) -> None:
        self.main_max = main_max
        self.protected_max = int(PROTECTED_PERCENT * main_max)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.window or key in self.probation or key in self.protected

    def __len__(self) -> int:
        return self._n

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        if self._counts:
            self.sketch.increment(key)
        if key in self.window:
            self.window.move_to_end(key)
        elif key in self.probation:
            del self.probation[key]
            self.protected[key] = None
            self._demote()
        else:
            self.protected.move_to_end(key)
        self._climb(True)

    def _demote(self) -> None:
        while len(self.protected) > self.protected_max:
            key, _ = self.protected.popitem(last=False)
            self.probation[key] = None

    def _main_victim(self) -> Hashable | None:
        if self.probation:
            return next(iter(self.probation))
        if self.protected:
            return next(iter(self.protected))
        return None

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        if self._counts:
            self.sketch.increment(key)
        self.window[key] = None
        self._n += 1
        candidates: list[Hashable] = []
        while len(self.window) > self.window_max:
            candidate, _ = self.window.popitem(last=False)
            self.probation[candidate] = None
            candidates.append(candidate)
        evicted: list[Eviction] = []
        while self._n > self.capacity:
            evicted.append(self._evict_main(candidates))
        self._climb(False)
        return evicted

    def _evict_main(self, candidates: list[Hashable]) -> Eviction:
        """Duel the oldest pending window candidate against the main region's LRU victim."""
        victim = next(iter(self.probation), None)
        if victim is not None and candidates and victim == candidates[0]:
            victim = next(iter(self.protected), None)
        if candidates and victim is not None:
            candidate = candidates[0]
            loser = victim if self.admission.admit(candidate, victim) else candidate
            candidates.remove(candidate)
        elif candidates:
            loser = candidates.pop(0)
        elif victim is not None:
            loser = victim
        else:
            loser = next(iter(self.window))
        self.on_remove(loser)
        return Eviction(loser)

    def _climb(self, hit: bool) -> None:
        if self.climber is None:
            return
        amount = self.climber.record(hit)
        if amount > 0:
            self._grow_window(min(amount, self.main_max))
        elif amount < 0:
            self._shrink_window(min(-amount, self.window_max - 1))

    def _grow_window(self, quota: int) -> None:
        self.window_max += quota
        self._set_main(self.main_max - quota)
        for _ in range(quota):
            if len(self.probation) + len(self.protected) <= self.main_max:
                break
            source = self.probation if self.probation else self.protected
            key, _ = source.popitem(last=False)
            self.window[key] = None
            self.window.move_to_end(key, last=False)
        self._demote()

    def _shrink_window(self, quota: int) -> None:
        if quota <= 0:
            return
        self.window_max -= quota
        self._set_main(self.main_max + quota)
        while len(self.window) > self.window_max:
            key, _ = self.window.popitem(last=False)
            self.probation[key] = None

    def on_remove(self, key: Hashable) -> None:
        if key in self.window:
            del self.window[key]
        elif key in self.probation:
            del self.probation[key]
        elif key in self.protected:
            del self.protected[key]
        else:
            return
        self._n -= 1
