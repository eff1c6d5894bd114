"""Least-recently-used eviction, size-aware: the baseline every other policy is measured against."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy


class LRU(Policy):
    name = "lru"
    size_aware = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._entries: OrderedDict[Hashable, int] = OrderedDict()
        self._used = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def used(self) -> int:
        return self._used

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self._entries.move_to_end(key)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        if size > self.capacity:
            return [Eviction(key, "rejected")]
        evicted: list[Eviction] = []
        while self._used + size > self.capacity:
            victim, victim_size = self._entries.popitem(last=False)
            self._used -= victim_size
            evicted.append(Eviction(victim))
        self._entries[key] = size
        self._used += size
        return evicted

    def on_remove(self, key: Hashable) -> None:
        size = self._entries.pop(key, None)
        if size is not None:
            self._used -= size
