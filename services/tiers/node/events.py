"""What a node does with the events it hears: invalidations (and their neighbours), heat decisions,
warmup / promotion / eviction commands, ended conversations, and forgetting its memory after a time it
could not hear. Each is applied once: a redelivered event does nothing twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from schemas.events import (
    CacheInvalidated,
    ConversationEnded,
    EvictionRequested,
    HeatScored,
    PromotionRequested,
    WarmupRequested,
)
from services.tiers.node.placement import Placement

log = logging.getLogger(__name__)

_REMEMBERED_COMMANDS = 10_000  # command ids kept to refuse a redelivery (beyond the consumer's window)
_REMEMBERED_INVALIDATIONS = 100_000  # invalidation ids kept to ignore one the outbox relay sends again


@dataclass(slots=True)
class CommandReport:
    """What one tier command did on this node (published as `WarmupApplied`)."""

    tier: str
    loaded: int = 0
    already_present: int = 0
    missing: int = 0
    from_l2: int = 0
    from_peers: int = 0
    from_l3: int = 0
    dropped: int = 0  # an eviction command


def _remember(seen: dict[str, None], event_id: str, bound: int) -> bool:
    """Whether `event_id` is new (then it is remembered, the oldest forgotten past `bound`)."""
    if event_id in seen:
        return False
    seen[event_id] = None
    while len(seen) > bound:
        del seen[next(iter(seen))]
    return True


class NodeEvents:
    """Applies the mesh's events to one node's tiers (`Placement`)."""

    def __init__(self, node: Placement) -> None:
        self.node = node
        self._applied_commands: dict[str, None] = {}  # oldest first
        self._applied_invalidations: dict[str, None] = {}  # the outbox relay may send one again

    def _for_me(self, node_id: str | None) -> bool:
        return node_id is None or node_id == "*" or node_id == self.node.node_id

    def on_invalidated(self, event: CacheInvalidated) -> list[str]:
        """Drop local entries at least `similarity_threshold` similar to the written embedding that ask
        the same question (the guards, when the event carries the written prompt), and the key itself
        unless this node wrote it (or already holds this write or a newer one)."""
        node = self.node
        node.counters.invalidations_received += 1
        if not _remember(self._applied_invalidations, event.event_id, _REMEMBERED_INVALIDATIONS):
            node.counters.invalidations_repeated += 1
            return []
        own = event.origin_node_id == node.node_id
        if not own:
            node.clock.observe(event.occurred_at_ms)
        node.fence(event.key, event.occurred_at_ms)
        candidates = {event.key}
        if event.embedding is not None and event.similarity_threshold is not None and node.dim is not None:
            if len(event.embedding) == node.dim:
                try:
                    candidates |= node.stale_neighbours(
                        event.embedding, event.similarity_threshold, event.prompt_text, event.model
                    )
                except ValueError:  # a zero vector has no cosine: the exact key still goes
                    log.warning("invalidation with an unusable embedding", extra={"key": event.key})
            else:
                log.warning(
                    "invalidation embedding has the wrong dimension; dropping the exact key only",
                    extra={"key": event.key, "dim": len(event.embedding)},
                )
        if not own:
            node.matcher.forget(event.key)  # its labels were about the value before this write
        dropped = []
        for key in candidates:
            if key == event.key:
                if own:
                    continue
                meta = node.local_meta(key)
                if meta is not None and meta.updated_at_ms >= event.occurred_at_ms:
                    continue
            if node.drop_local(key, "invalidated"):
                dropped.append(key)
        node.counters.invalidated_entries += len(dropped)
        return sorted(dropped)

    def on_heat(self, event: HeatScored) -> None:
        """keep -> nothing; keep_alive -> refresh the entry in the eviction policy; evict -> drop it
        from L1 and L2 (L3 keeps the record)."""
        node = self.node
        if not self._for_me(event.node_id):
            return
        if event.decision == "evict":
            if node.drop_local(event.key, "heat"):
                node.counters.heat_evictions += 1
        elif event.decision == "keep_alive":
            touched = node.l1.touch(event.key)
            if node.l2 is not None:
                touched = node.l2.touch(event.key) or touched
            node.counters.heat_keep_alives += touched

    async def on_command(
        self, event: WarmupRequested | PromotionRequested | EvictionRequested
    ) -> CommandReport | None:
        """Warmup / promotion: load the keys (from L2, a peer's L2, else L3) into the target tier.
        Eviction: drop them locally. None when the command is not for this node or was applied already."""
        node = self.node
        if not self._for_me(event.node_id) or not _remember(
            self._applied_commands, event.event_id, _REMEMBERED_COMMANDS
        ):
            return None
        node.counters.commands += 1
        if isinstance(event, EvictionRequested):
            return CommandReport("l1", dropped=sum(node.drop_local(k, "evicted") for k in event.keys))
        tier = event.tier if isinstance(event, WarmupRequested) else event.to_tier
        report = CommandReport(tier)
        if tier == "l3":
            return report
        to_l1, l2 = tier == "l1", node.l2
        wanted = []
        for key in dict.fromkeys(event.keys):
            if (to_l1 and key in node.l1) or (not to_l1 and l2 is not None and key in l2):
                report.already_present += 1
                continue
            local = l2.get(key) if (to_l1 and l2 is not None and key in l2) else None
            if local is not None and local.meta.kind == "kv_block":
                report.already_present += 1  # KV lives in L2 (the block pool): as warm as it gets
            elif local is not None and node.admit(local, to_l2=False):
                report.loaded += 1
                report.from_l2 += 1
            else:
                wanted.append(key)
        if wanted and node.peers is not None:
            # Promoted into L1 and L2 (a peer's copy is as good as L3's).
            remote = await node.remote_entries([(k, None) for k in wanted])
            for hit in remote.values():
                node.admit(hit.entry)
            report.loaded += len(remote)
            report.from_peers += len(remote)
            wanted = [k for k in wanted if k not in remote]
        if wanted and node.l3 is not None:
            _, rows = await node.l3_call(node.l3.get_many, wanted, node.wall_ms())
            for entry in (rows or {}).values():
                if node.admit(entry, to_l1=to_l1):
                    report.loaded += 1
                    report.from_l3 += 1
            wanted = [k for k in wanted if k not in (rows or {})]
        report.missing = len(wanted)
        node.counters.warmed += report.loaded
        node.counters.warm_already_held += report.already_present
        return report

    async def on_conversation_ended(self, event: ConversationEnded) -> list[str]:
        """Entries bound to the conversation (its trace id, or listing it as a dependency) go, here
        and in L3 (idempotent: every node may do it)."""
        node, trace = self.node, event.trace_id
        node.counters.conversations_ended += 1
        dropped = []
        for key in node.unbind(trace):
            meta = node.local_meta(key)
            if meta is not None and trace in meta.bound_to() and node.drop_local(key, "context_ended"):
                dropped.append(key)
        if node.l3 is not None:
            # Not through the breaker: this runs on the consumer, which retries a transient failure.
            for key in await node.l3.delete_bound_to(trace):
                if node.drop_local(key, "context_ended"):
                    dropped.append(key)
        node.counters.context_dropped += len(dropped)
        return sorted(dropped)

    def forget_memory(self, reason: str = "unheard") -> int:
        """Drops every entry from this node's L1 and L2 (L3 keeps them): after a time this node could
        not hear invalidations, any copy it holds may have been replaced meanwhile, and the
        invalidations buffered by other nodes' producers during a broker outage can arrive after this
        node hears again. Returns how many entries went."""
        node = self.node
        keys = set(node.l1.keys())
        if node.l2 is not None:
            keys.update(node.l2.keys())
        gone = sum(1 for key in keys if node.drop_local(key, reason))
        node.counters.forgotten += gone
        return gone
