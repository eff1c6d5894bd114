"""What the heat service does with each event, without Kafka: feed the AI-native policy and turn its
scores into `heat.scores.v1` decisions (keep / evict / keep_alive), publishing only what changed.

Event time (`occurred_at_ms`) drives the policy's clock, so a replay and the live service agree.
"""

from __future__ import annotations

from collections.abc import Hashable

from policies.base import AccessMeta, Eviction
from policies.learned.heat import HeatPolicy
from schemas.events import (
    AttentionHeatReported,
    CacheAccessed,
    ConversationEnded,
    Decision,
    Event,
    HeatScored,
    KvBlockRemoved,
    KvBlockStored,
)

# The policy spells it with a hyphen; the wire contract with an underscore.
_WIRE_DECISION: dict[str, Decision] = {"keep": "keep", "evict": "evict", "keep-alive": "keep_alive"}


def attention_heat(head_heat: list[float]) -> float:
    """One number per block from per-head magnitudes: the hottest head, squashed into [0, 1]."""
    peak = max((abs(h) for h in head_heat), default=0.0)
    return peak / (1.0 + peak)


class HeatEngine:
    def __init__(self, policy: HeatPolicy) -> None:
        self.policy = policy
        self._published: dict[Hashable, Decision] = {}
        self._pending: list[HeatScored] = []
        self.events_applied = 0
        self.last_event_ms = 0

    def apply(self, event: Event) -> None:
        """Feeds one event to the policy; evictions it decides right away are queued for publishing."""
        now = event.occurred_at_ms
        self.last_event_ms = max(self.last_event_ms, now)
        evictions: list[Eviction] = []
        if isinstance(event, CacheAccessed):
            meta = AccessMeta(trace_id=event.trace_id)
            if event.key in self.policy:
                self.policy.on_hit(event.key, now, meta)
            else:
                evictions = self.policy.on_miss(event.key, now, 1, meta)
        elif isinstance(event, KvBlockStored):
            meta = AccessMeta(
                trace_id=event.trace_id,
                parent=event.parent_block_hash,
                attention_heat=attention_heat(event.head_heat) if event.head_heat else None,
            )
            if event.block_hash in self.policy:
                self.policy.on_hit(event.block_hash, now, meta)
            else:
                evictions = self.policy.on_miss(event.block_hash, now, 1, meta)
        elif isinstance(event, AttentionHeatReported):
            self.policy.observe_attention_heat(event.block_hash, attention_heat(event.head_heat))
        elif isinstance(event, KvBlockRemoved):
            self.policy.on_remove(event.block_hash)
            self._published.pop(event.block_hash, None)
        elif isinstance(event, ConversationEnded):
            evictions = self.policy.end_trace(event.trace_id, now)
        else:
            return
        self.events_applied += 1
        for eviction in evictions:
            self._queue(eviction.key, 0.0, None, "evict")

    def rescore(self, now_ms: int, limit: int) -> list[HeatScored]:
        """One re-score round: train on labels that came due, score everything, and return the
        decisions that differ from what was last published (at most `limit`; evictions first)."""
        self.policy.rescore(now_ms)
        for score in self.policy.scores():
            decision = _WIRE_DECISION[score.decision]
            if self._published.get(score.key) != decision:
                self._queue(score.key, score.score, score.cluster, decision)
        out, self._pending = self._pending[:limit], self._pending[limit:]
        return out

    def _queue(self, key: Hashable, score: float, cluster: int | None, decision: Decision) -> None:
        if decision == "evict":
            self._published.pop(key, None)
        else:
            self._published[key] = decision
        self._pending.append(
            HeatScored(
                key=str(key),
                score=min(max(score, 0.0), 1.0),
                decision=decision,
                cluster=cluster,
                model_version=self.policy.scorer.steps,
            )
        )
