"""What the heat policy remembers of recently evicted keys (last access tick, combined
recency-frequency), in flat arrays of a fixed size: no Python object per remembered key.

A two-way set-associative table of `slots` (4 capacities) cells indexed by the key's hash: a key may
sit in either of two cells, and a new ghost takes the empty one or else the one whose key was last
heard longer ago. This replaces an insertion-ordered dict of the last 4 capacities of evictions
(~200 bytes per ghost); it forgets a little earlier on average and keeps the recently used longer.
Tags are the key's `hash()` (identity for ints, so int keys never alias); a string key's hash is
salted per process, which is fine for state that never leaves it.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable

_MIX1 = 0x9E3779B97F4A7C15
_MIX2 = 0xC2B2AE3D27D4EB4F
_M64 = (1 << 64) - 1
_EMPTY = -1


class GhostTable:
    def __init__(self, slots: int) -> None:
        self.slots = max(2, slots)
        self._tag = array("q", bytes(8 * self.slots))
        self._last = array("q", [_EMPTY]) * self.slots
        self._crf = array("f", bytes(4 * self.slots))

    def _cells(self, key: Hashable) -> tuple[int, int, int]:
        h = hash(key)
        n = self.slots
        a = ((h * _MIX1) & _M64) % n
        b = ((h * _MIX2) & _M64) % n
        if b == a:
            b = (a + 1) % n
        return h, a, b

    def pop(self, key: Hashable) -> tuple[int, float] | None:
        """(last tick, CRF) of `key` if remembered, and forget it."""
        h, a, b = self._cells(key)
        tag, last = self._tag, self._last
        for i in (a, b):
            if last[i] != _EMPTY and tag[i] == h:
                out = (last[i], float(self._crf[i]))
                last[i] = _EMPTY
                return out
        return None

    def put(self, key: Hashable, last_tick: int, crf: float) -> None:
        h, a, b = self._cells(key)
        last = self._last
        i = a if last[a] == _EMPTY or (last[b] != _EMPTY and last[a] <= last[b]) else b
        self._tag[i] = h
        last[i] = last_tick
        self._crf[i] = crf

    def __len__(self) -> int:
        return self.slots - self._last.count(_EMPTY)
