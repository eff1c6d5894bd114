"""Belady's OPT, the offline bound: evict the key whose next use lies farthest in the future.

Reference: Belady, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
Journal 1966. Unit sizes (the sized problem is NP-hard). OPT may bypass: a newcomer used later than
every resident key is not cached, so no online policy, with or without admission, can beat it on
the same access sequence. The policy knows the whole sequence up front and expects exactly one
`on_hit` / `on_miss` call per element, in order.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from policies.base import AccessMeta, Eviction, Policy


def next_uses(keys: Sequence[Hashable] | np.ndarray) -> list[int]:
    """`out[i]` is the index of the next access to `keys[i]` after `i`; `len(keys) + i` if none
    (every value distinct, so "never again" entries still order deterministically)."""
    n = len(keys)
    out = [n] * n
    last: dict[Hashable, int] = {}
    items = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    for i in range(n - 1, -1, -1):
        key = items[i]
        out[i] = last.get(key, n + i)
        last[key] = i
    return out


class Belady(Policy):
    name = "opt"

    def __init__(self, capacity: int, future: Sequence[Hashable] | np.ndarray) -> None:
        super().__init__(capacity)
        self._keys = future.tolist() if isinstance(future, np.ndarray) else list(future)
        self._next = next_uses(self._keys)
        self._cursor = 0
        self._resident: dict[Hashable, int] = {}  # key -> index of its next use
        self._heap: list[tuple[int, Hashable]] = []  # (-next use, key), lazily pruned

    def __contains__(self, key: Hashable) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def _advance(self, key: Hashable) -> int:
        i = self._cursor
        if i >= len(self._keys) or self._keys[i] != key:
            raise ValueError(f"OPT replayed out of order at {i}: got {key!r}")
        self._cursor = i + 1
        return self._next[i]

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        nxt = self._advance(key)
        self._resident[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))

    def _farthest(self) -> tuple[int, Hashable]:
        while True:
            neg, key = self._heap[0]
            if self._resident.get(key) == -neg:
                return -neg, key
            heapq.heappop(self._heap)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        nxt = self._advance(key)
        evicted: list[Eviction] = []
        if len(self._resident) >= self.capacity:
            farthest, victim = self._farthest()
            if nxt >= farthest:
                return [Eviction(key, "rejected")]
            heapq.heappop(self._heap)
            del self._resident[victim]
            evicted.append(Eviction(victim))
        self._resident[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))
        if len(self._heap) > 4 * self.capacity + 64:
            self._heap = [(-n, k) for k, n in self._resident.items()]
            heapq.heapify(self._heap)
        return evicted

    def on_remove(self, key: Hashable) -> None:
        self._resident.pop(key, None)
