"""S3-FIFO: a small probationary FIFO, a main FIFO with a 2-bit frequency (CLOCK-like reinsertion)
and a ghost FIFO of keys evicted from the small one, counting entries (sizes are ignored).

Reference: Yang, Zhang, Qiu, Yue & Rashmi, "FIFO queues are all you need for cache eviction",
SOSP 2023, Algorithm 1; the authors' libCacheSim S3FIFO.c settles what the pseudo-code leaves open.
Parameters: small holds `small_ratio` (10%) of the capacity, main the rest, the ghost `ghost_ratio` (90%)
in keys; small's tail moves to main once hit `move_threshold` (2) times; `fill_main_first` is
libCacheSim's later variant (the default is the paper's). How it admits and evicts, step by step:
docs/heat.md ("S3-FIFO").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy

SMALL_RATIO = 0.10
GHOST_RATIO = 0.90
MOVE_THRESHOLD = 2
MAX_FREQ = 3


class S3FIFO(Policy):
    name = "s3fifo"

    def __init__(
        self,
        capacity: int,
        *,
        small_ratio: float = SMALL_RATIO,
        ghost_ratio: float = GHOST_RATIO,
        move_threshold: int = MOVE_THRESHOLD,
        fill_main_first: bool = False,
    ) -> None:
        super().__init__(capacity)
        # At least one slot each, so that tiny caches still have both queues.
        self.small_max = min(max(1, int(capacity * small_ratio)), max(1, capacity - 1))
        self.main_max = capacity - self.small_max
        self.ghost_max = int(capacity * ghost_ratio)
        self.move_threshold = move_threshold
        self.fill_main_first = fill_main_first
        self.small: OrderedDict[Hashable, int] = OrderedDict()  # key -> frequency, oldest first
        self.main: OrderedDict[Hashable, int] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._has_evicted = False

    def __contains__(self, key: Hashable) -> bool:
        return key in self.small or key in self.main

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        queue = self.small if key in self.small else self.main
        queue[key] = min(queue[key] + 1, MAX_FREQ)

    def _evict_small(self) -> Eviction | None:
        while self.small:
            key, freq = self.small.popitem(last=False)
            if freq >= self.move_threshold:
                self.main[key] = 0
                continue
            if self.ghost_max > 0:
                self.ghost[key] = None
                if len(self.ghost) > self.ghost_max:
                    self.ghost.popitem(last=False)
            return Eviction(key)
        return None

    def _evict_main(self) -> Eviction | None:
        main = self.main
        while main:
            key, freq = main.popitem(last=False)
            if freq:
                main[key] = freq - 1
                continue
            return Eviction(key)
        return None

    def _evict(self) -> Eviction:
        self._has_evicted = True
        if len(self.main) > self.main_max or not self.small:
            victim = self._evict_main()
        else:
            victim = self._evict_small()
            if victim is None:  # everything in small moved to main
                victim = self._evict_main()
        assert victim is not None, "evicting from an empty cache"
        return victim

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        # The ghost is consulted before evicting, so that this miss's own evictions cannot push
        # the key out of it.
        was_ghost = key in self.ghost
        if was_ghost:
            del self.ghost[key]
        evicted: list[Eviction] = []
        while len(self) >= self.capacity:
            evicted.append(self._evict())
        if was_ghost:
            self.main[key] = 0
        elif self.fill_main_first and not self._has_evicted and len(self.small) >= self.small_max:
            self.main[key] = 0
        else:
            self.small[key] = 0
        return evicted

    def on_remove(self, key: Hashable) -> None:
        if self.small.pop(key, None) is None:
            self.main.pop(key, None)
        self.ghost.pop(key, None)
