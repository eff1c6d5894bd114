"""GPU-tier retention that reads conversations: a block stays until its conversation's next turn is
expected, an ended conversation's blocks leave first, and blocks of no conversation fall back to LRU.

Belady's rule (evict the block whose next use is farthest; Belady 1966) with the next use predicted:
the mean residual life E[G - a | G > a] of the pooled pauses for a conversation idle `a` ms, scaled by
its own mean gap against the pooled median and divided by the chance that it goes on at all.
Parameters: `turn_idle_ms` (the planner's), `min_gaps` 8 (fewer: LRU), the last `max_gaps` 512 gaps,
gap average weight `gap_alpha` 0.5. Why: docs/warmup.md ("GPU-tier retention").
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import accumulate

from policies.base import AccessMeta, Eviction, Policy

ENDED = float("inf")
PRESUMED_ENDED = 1e15  # behind an ended conversation, ahead of any live one


@dataclass(slots=True)
class _Conversation:
    last_ms: int
    blocks: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)  # admission order
    gap_ms: float | None = None
    ended: bool = False
    turns: int = 1
    counted_end: bool = False  # counted in `_ends` (signalled, or presumed from a long pause)


class TurnAwareRetention(Policy):
    name = "turn-aware"

    def __init__(
        self,
        capacity: int,
        turn_idle_ms: int = 1_000,
        min_gaps: int = 8,
        max_gaps: int = 512,
        gap_alpha: float = 0.5,
    ) -> None:
        super().__init__(capacity)
        self.turn_idle_ms = turn_idle_ms
        self.min_gaps = min_gaps
        self.gap_alpha = gap_alpha
        self._owner: dict[Hashable, str | None] = {}  # resident block -> its conversation (None: none)
        self._loose: OrderedDict[Hashable, int] = OrderedDict()  # blocks of no conversation, LRU order
        self._convs: dict[str, _Conversation] = {}  # conversations heard of (resident or not)
        self._gaps: deque[float] = deque(maxlen=max_gaps)
        self._sorted: list[float] | None = None
        self._suffix: list[float] = []  # _suffix[i] = sum(_sorted[i:])
        self._order: tuple[int, list[str]] | None = None  # (now_ms, conversations farthest first)
        self._went_on: Counter[int] = Counter()  # turn k -> conversations that had a turn k + 1
        self._ends: Counter[int] = Counter()  # turn k -> conversations that ended after turn k
        self._known: OrderedDict[Hashable, str] = OrderedDict()  # block -> its last conversation
        self.max_known = 64 * capacity

    def __contains__(self, key: Hashable) -> bool:
        return key in self._owner

    def __len__(self) -> int:
        return len(self._owner)

    # -- what it hears --------------------------------------------------------------------------

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self._touch(key, now_ms, meta, admit=False)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        evicted: list[Eviction] = []
        while len(self._owner) >= self.capacity:
            victim = self._victim(now_ms)
            self._drop(victim)
            evicted.append(Eviction(victim))
        self._touch(key, now_ms, meta, admit=True)
        return evicted

    def on_remove(self, key: Hashable) -> None:
        if key in self._owner:
            self._drop(key)

    def ended(self, trace_id: str) -> list[Eviction]:
        """The conversation is over (context.lifecycle.v1): its blocks are the first to go. They stay
        resident until space is needed, so a late turn after all still finds them."""
        conv = self._convs.get(trace_id)
        if conv is not None:
            conv.ended = True
            self._count_end(conv)
            self._order = None
        return []

    def _count_end(self, conv: _Conversation) -> None:
        if not conv.counted_end:
            conv.counted_end = True
            self._ends[conv.turns] += 1

    def _touch(self, key: Hashable, now_ms: int, meta: AccessMeta | None, *, admit: bool) -> None:
        trace_id = meta.trace_id if meta is not None else None
        said = trace_id is not None
        if trace_id is None:  # a warmup load names no conversation: the block's last one, if known
            trace_id = self._known.get(key)
            if trace_id is not None and trace_id not in self._convs:
                trace_id = None
        previous = self._owner.get(key)
        if previous is not None and previous != trace_id:
            self._convs[previous].blocks.pop(key, None)
        if trace_id is None:
            self._owner[key] = None
            self._loose[key] = now_ms
            self._loose.move_to_end(key)
            return
        conv = self._convs.get(trace_id)
        if conv is None:
            conv = self._convs[trace_id] = _Conversation(now_ms)
            self._order = None
        elif said and now_ms - conv.last_ms >= self.turn_idle_ms:
            gap = float(now_ms - conv.last_ms)
            self._gaps.append(gap)
            self._sorted = None
            a = self.gap_alpha
            conv.gap_ms = gap if conv.gap_ms is None else (1 - a) * conv.gap_ms + a * gap
            if conv.counted_end:  # a turn after an end (signalled or presumed): it went on after all
                self._ends[conv.turns] -= 1
                conv.counted_end = False
            conv.ended = False
            self._went_on[conv.turns] += 1
            conv.turns += 1
        if said and now_ms > conv.last_ms:  # the order is kept within one instant (one request)
            conv.last_ms = now_ms
            self._order = None
        if said:
            self._known.pop(key, None)
            self._known[key] = trace_id
            if len(self._known) > self.max_known:
                self._known.popitem(last=False)
        self._loose.pop(key, None)
        self._owner[key] = trace_id
        if admit or key not in conv.blocks:
            conv.blocks[key] = None

    def _drop(self, key: Hashable) -> None:
        trace_id = self._owner.pop(key)
        if trace_id is None:
            del self._loose[key]
            return
        conv = self._convs[trace_id]
        conv.blocks.pop(key, None)
        if not conv.blocks and conv.ended:
            del self._convs[trace_id]

    # -- the prediction -------------------------------------------------------------------------

    def next_use_in_ms(self, trace_id: str, now_ms: int) -> float:
        """How long until the conversation is expected back (ENDED / PRESUMED_ENDED when it is not)."""
        conv = self._convs[trace_id]
        if conv.ended:
            return ENDED
        idle = float(now_ms - conv.last_ms)
        if len(self._gaps) < self.min_gaps:
            return idle  # nothing learned yet: its age, as LRU would rank it
        ordered = self._ordered()
        median = ordered[len(ordered) // 2]
        scale = conv.gap_ms / median if conv.gap_ms is not None and median > 0 else 1.0
        x = idle / scale
        i = bisect.bisect_right(ordered, x)
        if i == len(ordered):
            self._count_end(conv)
            return PRESUMED_ENDED + idle
        return scale * (self._suffix[i] / (len(ordered) - i) - x) / self.goes_on(conv.turns)

    def goes_on(self, turns: int) -> float:
        """P(a conversation that has had `turns` turns has another), from those seen to go on or end
        (Laplace-smoothed: a turn count never seen to end reads 1, and no estimate is ever 0)."""
        went_on, ended = self._went_on[turns], self._ends[turns]
        return (went_on + 1) / (went_on + ended + 1)

    def _ordered(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self._gaps)
            self._suffix = list(accumulate(reversed(self._sorted)))[::-1]
        return self._sorted

    def _victim(self, now_ms: int) -> Hashable:
        if self._order is None or self._order[0] != now_ms:
            live = [t for t, c in self._convs.items() if c.blocks]
            live.sort(key=lambda t: self.next_use_in_ms(t, now_ms))
            self._order = (now_ms, live)
        order = self._order[1]
        while order and (order[-1] not in self._convs or not self._convs[order[-1]].blocks):
            order.pop()
        loose = next(iter(self._loose), None)
        if order:
            farthest = order[-1]
            if loose is None or self.next_use_in_ms(farthest, now_ms) >= now_ms - self._loose[loose]:
                return next(reversed(self._convs[farthest].blocks))
        assert loose is not None, "capacity reached with nothing resident"
        return loose


class LruGuarded(Policy):
    """`TurnAwareRetention` that never does worse than LRU for long: shadows of both (key sets only,
    each run alone on the same accesses) count the hits each would have had, and while the LRU shadow
    leads, the resident set evicts by recency instead (set dueling: Qureshi et al., "Adaptive
    insertion policies for high performance caching", ISCA 2007). `window` accesses is the decay
    horizon of the lead; it costs a second turn-aware ranking and an LRU list of key ids."""

    name = "turn-aware+lru-guard"

    def __init__(self, capacity: int, window: int = 4_096, turn_idle_ms: int = 1_000) -> None:
        super().__init__(capacity)
        self.main = TurnAwareRetention(capacity, turn_idle_ms=turn_idle_ms)
        self._shadow_turn = TurnAwareRetention(capacity, turn_idle_ms=turn_idle_ms)
        self._shadow_lru: OrderedDict[Hashable, None] = OrderedDict()
        self._recency: OrderedDict[Hashable, None] = OrderedDict()  # residents, least recent first
        self._decay = 1.0 - 1.0 / window
        self.lead = 0.0  # decayed hits of the turn-aware shadow minus the LRU shadow's
        self.by_recency = False
        self.switches = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self.main

    def __len__(self) -> int:
        return len(self.main)

    def _shadow(self, key: Hashable, now_ms: int, meta: AccessMeta | None) -> None:
        turn_hit = key in self._shadow_turn
        if turn_hit:
            self._shadow_turn.on_hit(key, now_ms, meta)
        else:
            self._shadow_turn.on_miss(key, now_ms, 1, meta)
        lru_hit = key in self._shadow_lru
        self._shadow_lru[key] = None
        self._shadow_lru.move_to_end(key)
        if len(self._shadow_lru) > self.capacity:
            self._shadow_lru.popitem(last=False)
        self.lead = self._decay * self.lead + turn_hit - lru_hit
        if (self.lead < 0) != self.by_recency:
            self.by_recency = not self.by_recency
            self.switches += 1

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        self._shadow(key, now_ms, meta)
        self.main.on_hit(key, now_ms, meta)
        self._recency.move_to_end(key)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        self._shadow(key, now_ms, meta)
        evicted: list[Eviction] = []
        while self.by_recency and len(self.main) >= self.capacity:
            victim, _ = self._recency.popitem(last=False)
            self.main.on_remove(victim)
            evicted.append(Eviction(victim))
        evicted += self.main.on_miss(key, now_ms, size, meta)
        for e in evicted:
            self._recency.pop(e.key, None)
        self._recency[key] = None
        return evicted

    def on_remove(self, key: Hashable) -> None:
        self.main.on_remove(key)
        self._recency.pop(key, None)

    def ended(self, trace_id: str) -> list[Eviction]:
        self._shadow_turn.ended(trace_id)
        return self.main.ended(trace_id)
