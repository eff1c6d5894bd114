"""The tiered cache of one node (docs/design.md §1.1, §1.3, §4.4), a thin facade over its parts:
placement (`Placement`, placement.py: the tiers, fences and counters), lookups (`LookupExecutor`,
executor.py, walking the plan of plan.py; the matcher decides), writes (`Writes`, writes.py) and the
events the node hears (`NodeEvents`, events.py). Work flows one way: each part acts on the placement.

What a put does (write-with-sync), the L3 breaker, local-only mode and the events a node hears:
docs/tiers.md ("The tiered cache of a node").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.events import (
    CacheInvalidated,
    ConversationEnded,
    EvictionRequested,
    HeatScored,
    PromotionRequested,
    Tier,
    WarmupRequested,
)
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import EntryMeta
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.blocks import Located
from services.tiers.l2.store import L2Store
from services.tiers.node.causal import CausalClock
from services.tiers.node.counters import Counters
from services.tiers.node.degrade import Mode, ModeChange
from services.tiers.node.events import CommandReport, NodeEvents
from services.tiers.node.executor import LookupExecutor
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import Outbox
from services.tiers.node.placement import Placement
from services.tiers.node.plan import Lookup, Pending, Query
from services.tiers.node.writes import BlockPut, L3Unavailable, PutResult, Writes
from services.tiers.ports import L3Store

__all__ = ["BlockPut", "CommandReport", "L3Unavailable", "Lookup", "PutResult", "Query", "TieredCache"]

log = logging.getLogger(__name__)


class TieredCache:
    """One node's L1, L2 and L3 (and the peers' L2) behind one API: lookups, writes, events, stats.

    The keywords are `Placement`'s, plus `write_behind` and `max_pending_l3_writes` for `Writes`. What
    the service sets after start-up (peers, the refiner, hearing) it sets on `placement`."""

    __slots__ = ("_seen_hits", "_seen_lookups", "events", "lookups", "placement", "writes")

    def __init__(
        self, *, write_behind: bool = False, max_pending_l3_writes: int = 10_000, **parts: Any
    ) -> None:
        self.placement = Placement(**parts)
        self.lookups = LookupExecutor(self.placement)
        self.writes = Writes(self.placement, write_behind=write_behind, max_pending=max_pending_l3_writes)
        self.events = NodeEvents(self.placement)
        self._seen_hits = self._seen_lookups = 0  # the counters at the degrade guard's last check

    # --- the parts a caller reads ---------------------------------------------------------------

    @property
    def l1(self) -> L1Cache:
        return self.placement.l1

    @property
    def l2(self) -> L2Store | None:
        return self.placement.l2

    @property
    def l3(self) -> L3Store | None:
        return self.placement.l3

    @property
    def outbox(self) -> Outbox:
        return self.placement.outbox

    @property
    def matcher(self) -> Matcher:
        return self.placement.matcher

    @property
    def counters(self) -> Counters:
        return self.placement.counters

    @property
    def breaker(self) -> LatencyBreaker:
        return self.placement.breaker

    @property
    def clock(self) -> CausalClock:
        return self.placement.clock

    @property
    def node_id(self) -> str:
        return self.placement.node_id

    @property
    def wall_ms(self) -> Callable[[], int]:
        return self.placement.wall_ms

    @property
    def hearing(self) -> bool:
        return self.placement.hearing

    # --- reads (the executor walks the plan) ----------------------------------------------------

    def get_local(self, key: str, model: str | None = None) -> Lookup:
        """The local-only plan (L1 then L2, by exact key), synchronously; records the access."""
        return self.lookups.get_local(key, model)

    def begin(self, query: Query) -> Lookup | Pending:
        """`get`'s in-process part: the answer where this node's memory settles it, else the walk left
        for `finish`."""
        return self.lookups.begin(query)

    async def finish(self, pending: Pending) -> Lookup:
        """The rest of a lookup `begin` left open: the peers, L3, the decision."""
        return await self.lookups.finish(pending)

    async def get(
        self,
        key: str | None = None,
        embedding: npt.ArrayLike | None = None,
        *,
        model: str | None = None,
        tolerance: float | None = None,
        trace_id: str | None = None,
        text: str | None = None,
        screened: bool = False,
    ) -> Lookup:
        """`text`: the request's text when `embedding` is its embedding (the guards need it);
        `screened`: that embedding is the cheap model's (refine.py)."""
        vec = None if embedding is None else np.asarray(embedding, dtype=np.float32)
        got = self.lookups.begin(Query(key, vec, model, tolerance, trace_id, text, screened))
        return got if isinstance(got, Lookup) else await self.lookups.finish(got)

    async def get_many(self, queries: Sequence[Query]) -> list[Lookup]:
        """Batched lookups along the same plan as `get`."""
        return await self.lookups.get_many(queries)

    def holds_exact(self, key: str, model: str | None = None) -> bool:
        return self.placement.holds_exact(key, model)

    def held_locally(self, keys: Sequence[str], model: str | None = None) -> list[tuple[Tier, int]]:
        return self.placement.held_locally(keys, model)

    def locate_prefix(self, keys: Sequence[str], model: str | None = None) -> list[Located]:
        return self.placement.locate_prefix(keys, model)

    async def entry_meta(self, key: str) -> EntryMeta | None:
        return await self.placement.entry_meta(key)

    # --- writes (writes.py) ---------------------------------------------------------------------

    async def put(
        self, meta: EntryMeta, blob: bytes, *, invalidate_threshold: float | None = None
    ) -> PutResult:
        """Write-with-sync: L3, then L1/L2, then the invalidation for every node."""
        return await self.writes.put(meta, blob, invalidate_threshold=invalidate_threshold)

    async def put_blocks(self, items: list[tuple[EntryMeta, bytes]]) -> list[BlockPut]:
        """KV blocks under content keys: one held already for its model is left as it is."""
        return await self.writes.put_blocks(items)

    async def delete(self, key: str) -> bool:
        """Drop `key` everywhere (L3 too) and tell every node."""
        return await self.writes.delete(key)

    async def flush_pending(self, max_ops: int = 100) -> int:
        """Hand queued writes/deletes to L3 while the breaker lets them through; returns how many."""
        return await self.writes.flush_pending(max_ops)

    @property
    def pending_l3_writes(self) -> int:
        return self.writes.pending

    # --- events from other nodes and services (events.py) ---------------------------------------

    def on_invalidated(self, event: CacheInvalidated) -> list[str]:
        return self.events.on_invalidated(event)

    def on_heat(self, event: HeatScored) -> None:
        self.events.on_heat(event)

    async def on_command(
        self, event: WarmupRequested | PromotionRequested | EvictionRequested
    ) -> CommandReport | None:
        return await self.events.on_command(event)

    async def on_conversation_ended(self, event: ConversationEnded) -> list[str]:
        return await self.events.on_conversation_ended(event)

    def forget_memory(self, reason: str = "unheard") -> int:
        return self.events.forget_memory(reason)

    # --- housekeeping ---------------------------------------------------------------------------

    def expire(self) -> int:
        gone = len(self.l1.expire())
        if self.l2 is not None:
            gone += len(self.l2.expire(self.wall_ms()))
        return gone

    @property
    def degraded(self) -> bool:
        return self.breaker.state != "closed"

    @property
    def mode(self) -> Mode:
        return "local_only" if self.placement.local_only else "normal"

    def check_mode(self) -> ModeChange | None:
        """Give the degrade guard the lookups and hits since the last check; the change of mode, if any
        (the service publishes it). Lookups read the mode, not the guard: nothing on their path. A node
        without peers stays normal: local-only skips the peers' L2, so there it would change nothing."""
        node = self.placement
        if node.degrade is None or node.peers is None:
            return None
        c = node.counters
        hits = sum(c.hits.values())
        change = node.degrade.observe(hits - self._seen_hits, c.lookups - self._seen_lookups)
        self._seen_hits, self._seen_lookups = hits, c.lookups
        node.local_only = node.degrade.local_only
        if change is not None:
            log.warning(
                "serving mode changed",
                extra={"node_id": self.node_id, "mode": change.mode, "reason": change.reason},
            )
        return change

    def stats(self) -> dict[str, Any]:
        node = self.placement
        c = node.counters
        hits = sum(c.hits.values())
        l1 = self.l1.stats()
        return {
            "node_id": self.node_id,
            "degraded": self.degraded,
            "serving": "l1+l2 only (L3 circuit breaker open)" if self.degraded else "l1+l2+l3",
            "mode": self.mode,
            "local_only": {
                "enabled": node.degrade is not None and node.peers is not None,
                # why the node never goes local-only, when it does not
                "off_because": (
                    "disabled" if node.degrade is None else "no peers to skip" if node.peers is None else None
                ),
                "peers_skipped": c.peers_skipped,
                **(asdict(node.degrade.stats()) if node.degrade is not None else {}),
            },
            "lookups": c.lookups,
            "hits": hits,
            "misses": c.misses,
            "hit_rate": hits / c.lookups if c.lookups else None,
            "hits_by_tier": dict(c.hits),
            "degraded_lookups": c.degraded_lookups,
            "fenced": c.fenced,
            # How far this node's stamps run ahead of its wall clock (another node's clock is ahead),
            # and the stamps too far ahead to believe.
            "clock_ahead_ms": max(0, self.clock.now() - self.wall_ms()),
            "clock_refused": self.clock.refused,
            "stamps_retaken": c.stamps_retaken,
            "forgotten": c.forgotten,
            "hearing": self.hearing,
            "unheard_lookups": c.unheard_lookups,
            "puts": c.puts,
            "deletes": c.deletes,
            "invalidations_received": c.invalidations_received,
            "invalidated_entries": c.invalidated_entries,
            "heat": {"evictions": c.heat_evictions, "keep_alives": c.heat_keep_alives},
            "commands": c.commands,
            "warmed": c.warmed,
            "warm_already_held": c.warm_already_held,
            "conversations_ended": c.conversations_ended,
            "context_dropped": c.context_dropped,
            "refine": node.refiner.stats() if node.refiner is not None else None,
            "l1": {
                "entries": l1.entries,
                "bytes_used": l1.bytes_used,
                "capacity_bytes": self.l1.capacity_bytes,
                "max_entries": self.l1.max_entries,
                "exact_hits": l1.exact_hits,
                "semantic_hits": l1.semantic_hits,
                "misses": l1.misses,
                "evictions": l1.evictions,
                "ann": self.l1.index.ann.name if self.l1.index is not None and self.l1.index.ann else None,
            },
            "l2": asdict(self.l2.stats()) if self.l2 is not None else None,
            "l3": {
                "configured": self.l3 is not None,
                "semantic_search": bool(self.l3 is not None and self.l3.semantic),
                "breaker": asdict(self.breaker.stats()),
                "errors": c.l3_errors,
                "pending_writes": self.writes.pending,
                "written_behind": c.l3_written_behind,
            },
            "l2_remote": {
                "serving": node.l2_address,
                "hits": c.remote_hits,
                "rejected": c.remote_rejected,
                "failures": c.remote_failures,
                **(node.peers.stats() if node.peers is not None else {"peers": []}),
            },
            "outbox": asdict(self.outbox.stats()),
        }
