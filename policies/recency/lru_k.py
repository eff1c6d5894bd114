"""LRU-K eviction (K=2 by default), size-aware.

Reference: O'Neil, O'Neil, Weikum, "The LRU-K page replacement algorithm for database disk
buffering", SIGMOD 1993; the token layer of docs/design.md §2.3 uses LRU-2. The victim is the resident entry
whose K-th most recent reference is oldest; entries with fewer than K references count as infinitely
old and go first, least recent first (the paper's subsidiary policy). Reference history of evicted
keys is retained for up to `history` keys (default: capacity) so a returning key keeps its past.
Time is a logical access counter, so ties in `now_ms` cannot reorder victims.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy


class LRUK(Policy):
    name = "lru2"
    size_aware = True

    def __init__(self, capacity: int, k: int = 2, history: int | None = None) -> None:
        super().__init__(capacity)
        if k < 2:
            raise ValueError("LRU-K needs k >= 2 (k = 1 is LRU)")
        self.k = k
        self._tick = 0
        self._refs: dict[Hashable, deque[int]] = {}
        self._size: dict[Hashable, int] = {}
        self._young: OrderedDict[Hashable, None] = OrderedDict()  # fewer than k references
        self._heap: list[tuple[int, Hashable]] = []  # (k-th last reference, key), lazily pruned
        self._history: OrderedDict[Hashable, deque[int]] = OrderedDict()
        self._history_cap = capacity if history is None else history
        self._used = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    @property
    def used(self) -> int:
        return self._used

    def _reference(self, key: Hashable, refs: deque[int]) -> None:
        self._tick += 1
        refs.append(self._tick)
        if len(refs) >= self.k:
            self._young.pop(key, None)
            heapq.heappush(self._heap, (refs[0], key))
            if len(self._heap) > 4 * len(self._size) + 64:
                self._heap = [(r[0], k) for k, r in self._refs.items() if len(r) >= self.k]
                heapq.heapify(self._heap)
        else:
            self._young[key] = None
            self._young.move_to_end(key)

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self._reference(key, self._refs[key])

    def _victim(self) -> Hashable:
        if self._young:
            return next(iter(self._young))
        while True:
            kth, key = self._heap[0]
            refs = self._refs.get(key)
            if refs is not None and len(refs) >= self.k and refs[0] == kth:
                return key
            heapq.heappop(self._heap)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        if size > self.capacity:
            return [Eviction(key, "rejected")]
        evicted: list[Eviction] = []
        while self._used + size > self.capacity:
            victim = self._victim()
            refs = self._refs[victim]
            self.on_remove(victim)
            self._remember(victim, refs)
            evicted.append(Eviction(victim))
        refs = self._history.pop(key) if key in self._history else deque(maxlen=self.k)
        self._refs[key] = refs
        self._size[key] = size
        self._used += size
        self._reference(key, refs)
        return evicted

    def _remember(self, key: Hashable, refs: deque[int]) -> None:
        if self._history_cap <= 0:
            return
        self._history[key] = refs
        if len(self._history) > self._history_cap:
            self._history.popitem(last=False)

    def on_remove(self, key: Hashable) -> None:
        size = self._size.pop(key, None)
        if size is None:
            return
        self._used -= size
        del self._refs[key]
        self._young.pop(key, None)
