"""Prefix chains evicted leaf by leaf by combined recency-frequency (LRFU: Lee et al., IEEE ToC 2001).

CRF = sum over past accesses of 2^(-age / half-life); `lam` is 1 / half-life in accesses. A leaf's
priority log2(CRF) + lam * last access orders leaves as CRF decayed to now does, so the queue never
needs re-scoring: an entry whose priority no longer matches is stale and is dropped when met.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from policies.learned.features import EntryTable


class LeafQueue:
    """A lazily pruned min-heap of leaf slots over the heat policy's entry table and CRF column."""

    def __init__(self, table: EntryTable, crf: np.ndarray, lam: float, capacity: int) -> None:
        self.table = table
        self.crf = crf
        self.lam = lam
        self.capacity = capacity
        self._heap: list[tuple[float, int, int]] = []  # (priority, serial, slot)
        self._serial = 0

    def _priority(self, s: int) -> float:
        return math.log2(float(self.crf[s])) + self.lam * int(self.table.last_tick[s])

    def push(self, s: int) -> None:
        """(Re)queue leaf `s` at its current priority; rebuild from the live leaves when stale
        entries outnumber them."""
        self._serial += 1
        heapq.heappush(self._heap, (self._priority(s), self._serial, s))
        if len(self._heap) > 4 * self.capacity + 64:
            t = self.table
            live = np.nonzero(t.used & (t.children == 0))[0].tolist()
            self._heap = []
            for leaf in live:
                self._serial += 1
                self._heap.append((self._priority(leaf), self._serial, leaf))
            heapq.heapify(self._heap)

    def least(self, exclude: int) -> int:
        """The resident leaf with the least combined recency-frequency (not `exclude`); -1 if none."""
        t, heap = self.table, self._heap
        skipped: list[tuple[float, int, int]] = []
        found = -1
        while heap:
            priority, _, s = heap[0]
            if not t.used[s] or t.children[s] != 0:
                heapq.heappop(heap)
                continue
            if self._priority(s) != priority:
                heapq.heappop(heap)
                continue
            if s == exclude:
                skipped.append(heapq.heappop(heap))
                continue
            found = s
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found
