"""Least-frequently-used eviction (in-cache counts, LRU among equal counts), size-aware.

Reference: the classic LFU; counts live only while an entry is resident, so a formerly hot entry
keeps its large count after the workload moves on (the pollution docs/design.md §2.2 describes). O(1) per
operation with one LRU-ordered bucket per count.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy


class LFU(Policy):
    name = "lfu"
    size_aware = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._count: dict[Hashable, int] = {}
        self._size: dict[Hashable, int] = {}
        self._buckets: dict[int, OrderedDict[Hashable, None]] = {}
        self._min = 0
        self._used = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._count

    def __len__(self) -> int:
        return len(self._count)

    @property
    def used(self) -> int:
        return self._used

    def frequency(self, key: Hashable) -> int:
        return self._count.get(key, 0)

    def _unlink(self, key: Hashable, count: int) -> None:
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]
            if self._min == count:
                self._min = 0  # unknown until the next eviction scans the buckets

    def _link(self, key: Hashable, count: int) -> None:
        self._buckets.setdefault(count, OrderedDict())[key] = None
        if count == 1 or (self._min != 0 and count < self._min):
            self._min = count

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        count = self._count[key]
        self._unlink(key, count)
        self._count[key] = count + 1
        self._link(key, count + 1)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        if size > self.capacity:
            return [Eviction(key, "rejected")]
        evicted: list[Eviction] = []
        while self._used + size > self.capacity:
            if self._min == 0:
                self._min = min(self._buckets)
            victim = next(iter(self._buckets[self._min]))
            self.on_remove(victim)
            evicted.append(Eviction(victim))
        self._count[key] = 1
        self._size[key] = size
        self._used += size
        self._link(key, 1)
        return evicted

    def on_remove(self, key: Hashable) -> None:
        count = self._count.pop(key, None)
        if count is None:
            return
        self._used -= self._size.pop(key)
        self._unlink(key, count)
