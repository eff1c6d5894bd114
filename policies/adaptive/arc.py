"""Adaptive Replacement Cache, counting entries (sizes are ignored).

Reference: Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003, Fig. 4.
T1/T2 hold resident keys seen once / at least twice, B1/B2 their ghosts; the target size `p` of T1
moves by max(1, |B2|/|B1|) on a B1 ghost hit and by max(1, |B1|/|B2|) on a B2 ghost hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from policies.base import AccessMeta, Eviction, Policy


class ARC(Policy):
    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        else:
            self.t2.move_to_end(key)

    def _replace(self, in_b2: bool) -> Eviction:
        t1 = len(self.t1)
        if t1 and ((in_b2 and t1 == self.p) or t1 > self.p or not self.t2):
            victim, _ = self.t1.popitem(last=False)
            self.b1[victim] = None
        else:
            victim, _ = self.t2.popitem(last=False)
            self.b2[victim] = None
        return Eviction(victim)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        c = self.capacity
        full = len(self.t1) + len(self.t2) >= c
        evicted: list[Eviction] = []
        if key in self.b1:
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[key]
            if full:
                evicted.append(self._replace(False))
            self.t2[key] = None
            return evicted
        if key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[key]
            if full:
                evicted.append(self._replace(True))
            self.t2[key] = None
            return evicted
        l1 = len(self.t1) + len(self.b1)
        total = l1 + len(self.t2) + len(self.b2)
        if l1 >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                if full:
                    evicted.append(self._replace(False))
            else:
                victim, _ = self.t1.popitem(last=False)
                evicted.append(Eviction(victim))
        elif total >= c:
            if total >= 2 * c:
                self.b2.popitem(last=False)
            if full:
                evicted.append(self._replace(False))
        self.t1[key] = None
        return evicted

    def on_remove(self, key: Hashable) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)
