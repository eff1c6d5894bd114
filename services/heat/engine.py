"""What the heat service does with each event, without Kafka: feed the AI-native policy and turn its
scores into `heat.scores.v1` decisions (keep / evict / keep_alive), publishing only what changed.

Event time (`occurred_at_ms`) drives the policy's clock, so a replay and the live service agree. A child
block that arrives before its parent is parked (`orphan_hold_ms`, `max_orphans`); with several heat
services each decides the keys of its own partitions (`apply` is told where an event came from, `forget`
drops the keys of partitions taken away). How and why: docs/heat.md ("The heat engine").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable

from policies.base import AccessMeta, Eviction
from policies.learned.compiled import CompiledHeat
from policies.learned.heat import HeatPolicy
from schemas.events import (
    AttentionHeatReported,
    CacheAccessBatch,
    CacheAccessed,
    ConversationEnded,
    Decision,
    Event,
    HeatScored,
    KvBlockRemoved,
    KvBlockStored,
)

Origin = tuple[str, int]  # (topic, partition) an event was read from

# The policy spells it with a hyphen; the wire contract with an underscore.
_WIRE_DECISION: dict[str, Decision] = {"keep": "keep", "evict": "evict", "keep-alive": "keep_alive"}


def attention_heat(head_heat: list[float]) -> float:
    """One number per block from per-head magnitudes: the hottest head, squashed into [0, 1]."""
    peak = max((abs(h) for h in head_heat), default=0.0)
    return peak / (1.0 + peak)


class HeatEngine:
    def __init__(
        self,
        policy: HeatPolicy | CompiledHeat,
        orphan_hold_ms: int = 5_000,
        max_orphans: int = 10_000,
        foreign_parent: Callable[[str], bool] | None = None,
    ) -> None:
        self.policy = policy
        # Whether a parent block's events go to another owner (None: every block is heard here).
        self.foreign_parent = foreign_parent
        self._published: dict[Hashable, Decision] = {}
        self._pending: list[HeatScored] = []
        self.events_applied = 0
        self.last_event_ms = 0
        self.orphan_hold_ms = orphan_hold_ms
        self.max_orphans = max_orphans
        # Parked children, oldest first: block hash -> event; and parent hash -> its parked children.
        self._orphans: OrderedDict[str, KvBlockStored] = OrderedDict()
        self._waiting: dict[str, list[str]] = {}
        self.orphans_adopted = 0  # parked, then applied after their parent
        self.orphans_expired = 0  # parked, then applied without it
        self.rounds = 0  # re-score rounds asked for, idle ones included
        self.scored_events = -1  # `events_applied` at the last round that re-scored
        # Where each key's events arrive (topic, partition), for `forget`; pruned to the tracked keys.
        self._origin: dict[Hashable, Origin] = {}
        self._origin_bound = 1024
        self.forgotten = 0  # keys dropped because their partition went to another owner

    @property
    def orphans_parked(self) -> int:
        return len(self._orphans)

    def apply(self, event: Event, origin: Origin | None = None) -> None:
        """Feeds one event to the policy (a chained block whose parent has not arrived yet waits for
        it); evictions the policy decides right away are queued for publishing. A batch record is its
        events, in order. `origin`: the (topic, partition) it was read from, for `forget`."""
        if isinstance(event, CacheAccessBatch):
            for access in event.events:
                self.apply(access, origin)
            return
        if origin is not None:
            self._note_origin(event, origin)
        self.last_event_ms = max(self.last_event_ms, event.occurred_at_ms)
        if isinstance(event, KvBlockStored) and self._is_orphan(event):
            self._park(event)
        else:
            if isinstance(event, KvBlockRemoved) and event.block_hash in self._orphans:
                self._unpark(event.block_hash)
            self._apply(event)
            if isinstance(event, KvBlockStored):
                self._adopt(event.block_hash)
        self._expire()

    def _note_origin(self, event: Event, origin: Origin) -> None:
        key = event.key if isinstance(event, CacheAccessed) else getattr(event, "block_hash", None)
        if key is None:
            return
        self._origin[key] = origin
        if len(self._origin) > self._origin_bound:
            # Keys the policy no longer tracks (evicted, removed): their origin is not needed. Checked
            # against a bound set at the last prune, so most events do not count the tracked keys.
            self._origin = {k: o for k, o in self._origin.items() if k in self.policy or k in self._orphans}
            self._origin_bound = 2 * (len(self.policy) + len(self._orphans)) + 1024

    def forget(self, origins: Collection[Origin]) -> int:
        """Drops every key whose events arrived from `origins` (partitions a rebalance gave to another
        owner): from the policy, the parked blocks and the decisions not yet published; nothing is
        published about them. Returns how many tracked or parked keys went."""
        gone = {key for key, origin in self._origin.items() if origin in origins}
        if not gone:
            return 0
        dropped = 0
        for key in gone:
            del self._origin[key]
            if key in self._orphans:
                self._unpark(key)  # type: ignore[arg-type]
                dropped += 1
            elif key in self.policy:
                self.policy.on_remove(key)
                dropped += 1
            self._published.pop(key, None)
        names = {str(key) for key in gone}
        self._pending = [d for d in self._pending if d.key not in names]
        self.forgotten += dropped
        return dropped

    def _is_orphan(self, event: KvBlockStored) -> bool:
        parent = event.parent_block_hash
        return (
            parent is not None
            and event.block_hash not in self.policy
            and parent not in self.policy
            and self.orphan_hold_ms > 0
            and not self._foreign(parent)
        )

    def _foreign(self, parent: str) -> bool:
        return self.foreign_parent is not None and self.foreign_parent(parent)

    def _parent_here(self, event: KvBlockStored) -> str | None:
        """The parent the policy is told of: none where it belongs to another owner (the block then
        starts a chain here; the other owner keeps the parent)."""
        parent = event.parent_block_hash
        if parent is None or parent in self.policy or not self._foreign(parent):
            return parent
        return None

    def _park(self, event: KvBlockStored) -> None:
        if event.block_hash in self._orphans:
            self._unpark(event.block_hash)
        self._orphans[event.block_hash] = event
        assert event.parent_block_hash is not None
        self._waiting.setdefault(event.parent_block_hash, []).append(event.block_hash)
        while len(self._orphans) > self.max_orphans:
            self._release(next(iter(self._orphans)))

    def _unpark(self, block_hash: str) -> KvBlockStored:
        event = self._orphans.pop(block_hash)
        assert event.parent_block_hash is not None
        siblings = self._waiting.get(event.parent_block_hash, [])
        if block_hash in siblings:
            siblings.remove(block_hash)
        if not siblings:
            self._waiting.pop(event.parent_block_hash, None)
        return event

    def _release(self, block_hash: str) -> None:
        """Applies a parked block without its parent (held too long, or too many parked)."""
        self.orphans_expired += 1
        self._apply(self._unpark(block_hash))
        self._adopt(block_hash)

    def _adopt(self, parent: str) -> None:
        """Applies the children parked on `parent` (and theirs, down the chain) now that it arrived."""
        stack = [parent]
        while stack:
            for child in self._waiting.pop(stack.pop(), []):
                event = self._orphans.pop(child, None)
                if event is not None:
                    self.orphans_adopted += 1
                    self._apply(event)
                    stack.append(child)

    def _expire(self) -> None:
        horizon = self.last_event_ms - self.orphan_hold_ms
        while self._orphans:
            oldest = next(iter(self._orphans.values()))
            if oldest.occurred_at_ms > horizon:
                break
            self._release(oldest.block_hash)

    def _apply(self, event: Event) -> None:
        now = event.occurred_at_ms
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
                parent=self._parent_here(event),
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
        decisions that differ from what was last published (at most `limit`; evictions first).
        With no event since the last round nothing is re-scored or trained (an idle service stays
        idle: the model would only take another step over the same labels); what is still queued
        goes out."""
        self.rounds += 1
        if self.events_applied != self.scored_events:
            self.scored_events = self.events_applied
            self.policy.rescore(now_ms)
            # The compiled policy gives only the entries whose decision changed (the check below
            # still holds for them); the Python one every entry.
            policy = self.policy
            for score in policy.changed_scores() if isinstance(policy, CompiledHeat) else policy.scores():
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
