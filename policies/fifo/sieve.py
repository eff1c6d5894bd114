"""SIEVE: one FIFO queue, a visited bit per entry and a hand that sweeps from old to new, counting
entries (sizes are ignored).

Reference: Zhang, Yang, Yue, Vigfusson & Rashmi, "SIEVE is Simpler than LRU: an Efficient
Turn-Key Eviction Algorithm for Web Caches", NSDI 2024, Fig. 2; no parameter but the capacity.
The queue is kept as two ordered maps split at the hand (`swept`, `ahead`). How the hand sweeps, and
how the two maps stand for the queue: docs/heat.md ("SIEVE").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy


class SIEVE(Policy):
    name = "sieve"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.swept: OrderedDict[Hashable, bool] = OrderedDict()  # key -> visited, oldest first
        self.ahead: OrderedDict[Hashable, bool] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.ahead or key in self.swept

    def __len__(self) -> int:
        return len(self.ahead) + len(self.swept)

    @property
    def hand(self) -> Hashable | None:
        """The key the next eviction looks at first (None when empty)."""
        for half in (self.ahead, self.swept):
            if half:
                return next(iter(half))
        return None

    def queue(self) -> list[Hashable]:
        """Resident keys from tail (oldest) to head (newest)."""
        return [*self.swept, *self.ahead]

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        if key in self.ahead:
            self.ahead[key] = True
        else:
            self.swept[key] = True

    def _evict(self) -> Eviction:
        while True:
            if not self.ahead:
                self.ahead, self.swept = self.swept, self.ahead
            key, visited = self.ahead.popitem(last=False)
            if not visited:
                return Eviction(key)
            self.swept[key] = False

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        evicted = [self._evict()] if len(self) >= self.capacity else []
        if not self.ahead:  # the hand is past the head: the next sweep starts at the tail
            self.ahead, self.swept = self.swept, self.ahead
        self.ahead[key] = False
        return evicted

    def on_remove(self, key: Hashable) -> None:
        if self.ahead.pop(key, None) is None:
            self.swept.pop(key, None)
