"""LIRS: eviction by inter-reference recency, counting entries (sizes are ignored).

Reference: Jiang & Zhang, "LIRS: An Efficient Low Inter-reference Recency Set Replacement Policy",
SIGMETRICS 2002 (the algorithm of §4.2). Parameters: the HIR blocks share `hir_percent` (1%) of the
cache in the FIFO queue Q; non-resident HIR blocks stay in the stack S as ghosts, at most `ghost_factor`
(10) times the capacity of them (and at most `max_ghosts`, 262,144, unless the capacity is larger), the
oldest forgotten first. How it works, and how it differs from libCacheSim's LIRS.c: docs/heat.md
("LIRS").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from enum import IntEnum

from policies.base import AccessMeta, Eviction, Policy

HIR_PERCENT = 0.01
GHOST_FACTOR = 10.0
MAX_GHOSTS = 1 << 18  # ... but no more than this many (or one capacity), to bound the memory


class Status(IntEnum):
    LIR = 0
    HIR = 1  # resident, in Q
    GHOST = 2  # non-resident, still in S


class LIRS(Policy):
    name = "lirs"

    def __init__(
        self,
        capacity: int,
        *,
        hir_percent: float = HIR_PERCENT,
        ghost_factor: float = GHOST_FACTOR,
        max_ghosts: int = MAX_GHOSTS,
    ) -> None:
        super().__init__(capacity)
        self.hir_max = min(capacity, max(1, round(hir_percent * capacity)))
        self.lir_max = capacity - self.hir_max
        self.ghost_max = max(1, min(int(ghost_factor * capacity), max(capacity, max_ghosts)))
        self.stack: OrderedDict[Hashable, None] = OrderedDict()  # S, oldest (bottom) first
        self.queue: OrderedDict[Hashable, None] = OrderedDict()  # Q, resident HIR, oldest first
        self.ghosts: OrderedDict[Hashable, None] = OrderedDict()  # ghost entries of S, oldest first
        self.status: dict[Hashable, Status] = {}
        self.lir = 0

    def __contains__(self, key: Hashable) -> bool:
        status = self.status.get(key)
        return status is not None and status != Status.GHOST

    def __len__(self) -> int:
        return self.lir + len(self.queue)

    def _prune(self) -> None:
        """Drop HIR entries from the bottom of S until a LIR block is there (the paper's pruning)."""
        stack, status = self.stack, self.status
        while stack:
            key = next(iter(stack))
            s = status[key]
            if s == Status.LIR:
                return
            del stack[key]
            if s == Status.GHOST:
                del status[key]
                del self.ghosts[key]

    def _demote_bottom(self) -> None:
        """The oldest LIR block becomes a resident HIR block at the end of Q."""
        self._prune()  # with no LIR block yet (a one-entry cache) HIR entries may lie below
        key, _ = self.stack.popitem(last=False)
        self.status[key] = Status.HIR
        self.lir -= 1
        self.queue[key] = None
        self._prune()

    def _make_lir(self, key: Hashable) -> None:
        self.status[key] = Status.LIR
        self.lir += 1
        self.stack[key] = None
        self.stack.move_to_end(key)
        while self.lir > self.lir_max:
            self._demote_bottom()

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        stack = self.stack
        if self.status[key] == Status.LIR:
            bottom = next(iter(stack)) == key
            stack.move_to_end(key)
            if bottom:
                self._prune()
        elif key in stack:  # resident HIR with a lower IRR than the oldest LIR block
            del self.queue[key]
            self._make_lir(key)
        else:
            stack[key] = None
            self.queue.move_to_end(key)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        status = self.status.get(key)
        if status is None and self.lir < self.lir_max:  # warming up: fill the LIR set
            self._make_lir(key)
            return []
        evicted: list[Eviction] = []
        if len(self) >= self.capacity:
            evicted.append(self._evict())
            status = self.status.get(key)  # the eviction may have pruned `key`'s ghost
        if status == Status.GHOST:
            del self.ghosts[key]
            self._make_lir(key)
        else:
            self.status[key] = Status.HIR
            self.stack[key] = None
            self.queue[key] = None
        return evicted

    def _evict(self) -> Eviction:
        if self.queue:
            victim, _ = self.queue.popitem(last=False)
            if victim in self.stack:
                self.status[victim] = Status.GHOST
                self.ghosts[victim] = None
                if len(self.ghosts) > self.ghost_max:
                    old, _ = self.ghosts.popitem(last=False)
                    del self.status[old]
                    del self.stack[old]
            else:
                del self.status[victim]
        else:  # every resident block is LIR (tiny caches): the oldest goes
            victim, _ = self.stack.popitem(last=False)
            del self.status[victim]
            self.lir -= 1
            self._prune()
        return Eviction(victim)

    def on_remove(self, key: Hashable) -> None:
        status = self.status.get(key)
        if status == Status.LIR:
            del self.stack[key]
            del self.status[key]
            self.lir -= 1
            self._prune()
        elif status == Status.HIR:
            del self.queue[key]
            self.stack.pop(key, None)
            del self.status[key]
