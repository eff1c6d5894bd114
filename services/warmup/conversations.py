"""Conversations between their turns: which KV blocks each one holds, which of them the engine has
dropped since (`kv.block_removed`), and when its next turn is likely to start.

A warmup is due once the early part of the expected gap has passed: the conversation's own mean idle gap
(an exponential average; before it has one, the median of every conversation's gaps) times the ratio of
the lower quartile to the median of all observed gaps (`lead_fraction` until 20 gaps are known), minus
the time the blocks take to load; at most once per turn. How early each warmup was: Δt = t_turn -
t_warm. Why this timing: docs/warmup.md ("Conversations between their turns").
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Conversation:
    node_id: str
    last_ms: int
    blocks: OrderedDict[str, None] = field(default_factory=OrderedDict)
    dropped: dict[str, None] = field(default_factory=dict)  # blocks removed since they were last seen
    gap_ms: float | None = None  # exponential average of the idle gaps between turns
    warmed_this_turn: bool = False
    warmed_at_ms: int | None = None  # when this turn's warmup was sent, until the next turn comes


@dataclass(frozen=True, slots=True)
class Due:
    trace_id: str
    node_id: str
    blocks: list[str]
    why: str
    turn_at_ms: int  # when the next turn is expected


class Conversations:
    def __init__(
        self,
        turn_idle_ms: int = 1_000,
        max_blocks: int = 1_024,
        max_conversations: int = 100_000,
        lead_fraction: float = 0.75,
        prior_quantile: float = 0.25,
        gap_alpha: float = 0.5,
        media: frozenset[str] = frozenset({"gpu", "cpu", "disk"}),
    ) -> None:
        self.media = media
        self.turn_idle_ms = turn_idle_ms
        self.max_blocks = max_blocks
        self.max_conversations = max_conversations
        self.lead_fraction = lead_fraction
        self.prior_quantile = prior_quantile
        self.gap_alpha = gap_alpha
        self._by_trace: OrderedDict[str, _Conversation] = OrderedDict()
        self._owner: OrderedDict[str, str] = OrderedDict()  # block -> trace id
        self._gaps: deque[float] = deque(maxlen=512)
        self._prior: tuple[float, float] | None = None  # (median, lower quartile / median) of `_gaps`
        # Conversations that may have something to warm; `due` looks at these only.
        self._pending: dict[str, None] = {}
        self.removals_seen = False
        self.measured: list[tuple[str, int, int]] = []  # (node, t_warm, t_turn), drained by the planner

    def __len__(self) -> int:
        return len(self._by_trace)

    def touch(self, trace_id: str, block: str, node_id: str | None, now_ms: int) -> None:
        conv = self._by_trace.pop(trace_id, None)
        if conv is None:
            conv = _Conversation(node_id or "*", now_ms)
        elif now_ms - conv.last_ms >= self.turn_idle_ms:
            gap = float(now_ms - conv.last_ms)  # a new turn: learn how long the pause was
            self._gaps.append(gap)
            self._prior = None
            conv.gap_ms = (
                gap if conv.gap_ms is None else (1 - self.gap_alpha) * conv.gap_ms + self.gap_alpha * gap
            )
            conv.warmed_this_turn = False
            if conv.warmed_at_ms is not None:
                self.measured.append((conv.node_id, conv.warmed_at_ms, now_ms))
                conv.warmed_at_ms = None
        conv.blocks.pop(block, None)
        conv.blocks[block] = None
        conv.dropped.pop(block, None)
        while len(conv.blocks) > self.max_blocks:
            old, _ = conv.blocks.popitem(last=False)
            conv.dropped.pop(old, None)
        if node_id is not None:
            conv.node_id = node_id
        conv.last_ms = max(conv.last_ms, now_ms)
        self._by_trace[trace_id] = conv
        if not self.removals_seen:
            self._pending[trace_id] = None
        self._owner.pop(block, None)
        self._owner[block] = trace_id
        while len(self._by_trace) > self.max_conversations:
            old_trace, _ = self._by_trace.popitem(last=False)
            self._pending.pop(old_trace, None)
        while len(self._owner) > self.max_conversations:
            self._owner.popitem(last=False)

    def removed(self, block: str, medium: str | None = None) -> None:
        """The engine dropped `block` from `medium`. Only drops from the media this planner warms
        into matter: warming into L2 (host/peer memory) is for blocks that left it (`cpu`, `disk`,
        or not said), not for those that left the GPU and still sit in L2."""
        if medium is not None and medium not in self.media:
            return
        self.removals_seen = True
        trace_id = self._owner.get(block)
        conv = self._by_trace.get(trace_id) if trace_id is not None else None
        if conv is not None and trace_id is not None and block in conv.blocks:
            conv.dropped[block] = None
            self._pending[trace_id] = None

    def ended(self, trace_id: str) -> None:
        self._by_trace.pop(trace_id, None)
        self._pending.pop(trace_id, None)

    def _gap_prior(self) -> tuple[float, float]:
        """(median gap, early fraction) from every conversation's gaps."""
        if self._prior is None:
            if len(self._gaps) < 20:
                median = sorted(self._gaps)[len(self._gaps) // 2] if self._gaps else float(self.turn_idle_ms)
                self._prior = (median, self.lead_fraction)
            else:
                ordered = sorted(self._gaps)
                median = ordered[len(ordered) // 2]
                quartile = ordered[int(self.prior_quantile * (len(ordered) - 1))]
                self._prior = (median, quartile / median if median > 0 else self.lead_fraction)
        return self._prior

    def expected_gap_ms(self, trace_id: str) -> float:
        conv = self._by_trace.get(trace_id)
        if conv is not None and conv.gap_ms is not None:
            return conv.gap_ms
        return self._gap_prior()[0]

    def due(self, now_ms: int, load_ms_per_block: float) -> list[Due]:
        """Conversations whose next turn is near enough that their missing blocks should load now."""
        out: list[Due] = []
        for trace_id in list(self._pending):
            conv = self._by_trace.get(trace_id)
            if conv is None or conv.warmed_this_turn:
                wanted = []
            else:
                wanted = list(conv.dropped) if self.removals_seen else list(conv.blocks)
            if conv is None or not wanted:
                del self._pending[trace_id]
                continue
            idle = now_ms - conv.last_ms
            if idle < self.turn_idle_ms:
                continue
            gap = self.expected_gap_ms(trace_id)
            start = conv.last_ms + self._gap_prior()[1] * gap - len(wanted) * load_ms_per_block
            if now_ms < start:
                continue
            why = (
                f"conversation {trace_id} idle {idle} ms, next turn expected after ~{gap:.0f} ms; "
                f"{len(wanted)} of its {len(conv.blocks)} blocks are not resident"
            )
            out.append(Due(trace_id, conv.node_id, wanted, why, int(conv.last_ms + gap)))
        return out

    def loading(self, trace_id: str, blocks: list[str], at_ms: int | None = None) -> None:
        """`blocks` were sent to be loaded (at `at_ms`): they are no longer missing (until removed
        again)."""
        conv = self._by_trace.get(trace_id)
        if conv is None:
            return
        if blocks and at_ms is not None and conv.warmed_at_ms is None:
            conv.warmed_at_ms = at_ms
        for block in blocks:
            conv.dropped.pop(block, None)
        # Once per turn; blocks the budget could not take yet keep it armed.
        conv.warmed_this_turn = not conv.dropped or not self.removals_seen
