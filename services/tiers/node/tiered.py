"""The tiered cache of one node (docs/design.md §1.1, §1.3, §4.4), a facade over its parts:
placement (`Placement`, placement.py), lookups (`LookupExecutor`, executor.py, walking the plan of
plan.py; the matcher decides), writes, L3 write-behind, events and stats.

What a put does (write-with-sync), the L3 breaker, local-only mode and the events a node hears:
docs/tiers.md ("The tiered cache of a node").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
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
    new_event_id,
)
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.vector_index import normalize
from services.tiers.node.degrade import Mode, ModeChange
from services.tiers.node.executor import LookupExecutor
from services.tiers.node.placement import Placement
from services.tiers.node.plan import Lookup, Pending, Query
from services.tiers.ports import L3Rejected

__all__ = ["BlockPut", "L3Unavailable", "Lookup", "PutResult", "Query", "TieredCache"]

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


@dataclass(frozen=True, slots=True)
class BlockPut:
    key: str
    status: str  # "stored" or "present" (held here already)
    tiers: tuple[Tier, ...]


class L3Unavailable(RuntimeError):
    """L3 is behind an open breaker and the write-behind queue is full."""


@dataclass(frozen=True, slots=True)
class PutResult:
    key: str
    size_bytes: int
    tiers: tuple[Tier, ...]
    persisted: bool  # False: waiting in the write-behind queue (L3 breaker open or L3 failing)
    invalidated_local: tuple[str, ...]
    updated_at_ms: int


class TieredCache(Placement):
    """One node's L1, L2 and L3 (and the peers' L2): lookups (`LookupExecutor`), writes, events, stats."""

    @functools.cached_property
    def lookups(self) -> LookupExecutor:
        return LookupExecutor(self)

    # --- reads (the executor walks the plan) ----------------------------------------------------

    def get_local(self, key: str, model: str | None = None) -> Lookup:
        """The local-only plan (L1 then L2, by exact key), synchronously; records the access."""
        return self.lookups.get_local(key, model)

    def begin(
        self,
        key: str | None = None,
        embedding: npt.ArrayLike | None = None,
        *,
        model: str | None = None,
        tolerance: float | None = None,
        trace_id: str | None = None,
        text: str | None = None,
        screened: bool = False,
    ) -> Lookup | Pending:
        """`get`'s in-process part: the answer where this node's memory settles it, else the walk left
        for `finish`."""
        vec = None if embedding is None else np.asarray(embedding, dtype=np.float32)
        return self.lookups.begin(Query(key, vec, model, tolerance, trace_id, text, screened))

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
        got = self.begin(
            key, embedding, model=model, tolerance=tolerance, trace_id=trace_id, text=text, screened=screened
        )
        return got if isinstance(got, Lookup) else await self.lookups.finish(got)

    async def get_many(self, queries: Sequence[Query]) -> list[Lookup]:
        """Batched lookups along the same plan as `get`."""
        return await self.lookups.get_many(queries)

    # --- writes ---------------------------------------------------------------------------------

    async def put(
        self, meta: EntryMeta, blob: bytes, *, invalidate_threshold: float | None = None
    ) -> PutResult:
        """Write-with-sync (docs/design.md §1.3): L3, then L1/L2, then the invalidation for every node."""
        if meta.embedding is not None and self.dim is not None and meta.embedding.shape != (self.dim,):
            raise ValueError(f"embedding has shape {meta.embedding.shape}; this cache uses ({self.dim},)")
        now = self.clock.now()
        meta = replace(meta, created_at_ms=now, updated_at_ms=now, size_bytes=len(blob))
        entry = Entry(meta, blob)
        threshold = meta.similarity_tolerance if invalidate_threshold is None else invalidate_threshold
        event = CacheInvalidated(
            key=meta.key,
            reason="write",
            model=meta.model,
            embedding=None if meta.embedding is None else meta.embedding.astype(float).tolist(),
            similarity_threshold=threshold if meta.embedding is not None else None,
            trace_id=meta.trace_id,
            origin_node_id=self.node_id,
            attempt=1,
            occurred_at_ms=now,
            prompt_text=meta.prompt_text if meta.embedding is not None else None,
        )
        # L3 records the invalidation with the write (its outbox): every node hears of an acknowledged
        # write even if this node dies or loses the broker before it publishes.
        persisted = await self._persist(entry, event)  # raises when refused: nothing changed here
        # From now on no older copy is served or placed (one placed while L3 wrote is dropped below).
        self.fence(meta.key, now)
        dropped: set[str] = set()
        if meta.embedding is not None:
            dropped = self._stale_neighbours(meta.embedding, threshold, meta.prompt_text, meta.model) - {
                meta.key
            }
            for key in dropped:
                self._drop_local(key, "invalidated")
        self._drop_local(meta.key, "replaced")
        self.matcher.forget(meta.key)
        tiers = self._admit(entry)
        if persisted:
            tiers = (*tiers, "l3")
        self.counters.puts += 1
        self.counters.invalidated_entries += len(dropped)
        self._publish_invalidation(event)
        return PutResult(meta.key, len(blob), tiers, persisted, tuple(sorted(dropped)), now)

    async def put_blocks(self, items: list[tuple[EntryMeta, bytes]]) -> list[BlockPut]:
        """KV blocks under content keys (cachemesh_client/kvkeys.py): a key and a model (the connector's
        tag names the weights) name the bytes, so a block this node holds already for that model is left
        as it is, and a new one goes to L3 and L2, replacing one of other weights under the key, without
        invalidating anything else (a block under the same key and model elsewhere is the same block).
        A block is still cached when L3 cannot take it now (written behind, or not at all: a cache may
        forget a block)."""
        out = []
        for meta, blob in items:
            if self.holds_exact(meta.key, meta.model):
                self._touch_local(meta.key)
                out.append(BlockPut(meta.key, "present", ()))
                continue
            now = self.clock.now()
            entry = Entry(replace(meta, created_at_ms=now, updated_at_ms=now, size_bytes=len(blob)), blob)
            try:
                persisted = await self._persist(entry, optional=True)
            except (L3Unavailable, L3Rejected):
                persisted = False
            self._drop_local(meta.key, "replaced")  # a block of other weights under this key, if any
            tiers = self._admit(entry)
            self.counters.puts += 1
            out.append(BlockPut(meta.key, "stored", (*tiers, "l3") if persisted else tiers))
        return out

    def _stale_neighbours(
        self, embedding: npt.ArrayLike, threshold: float, text: str | None, model: str | None
    ) -> set[str]:
        """Local entries a write of prompt `text` at `embedding` for `model` makes stale: of the same
        model (a lookup never matches across models, so a write must not drop another model's or
        tenant's entry either), at least `threshold` similar, and asking the same question (no guard
        fires when both prompts are known)."""
        q = normalize(embedding)[0]
        stale = set()
        for key in self._similar_local(embedding, threshold):
            meta = self._local_meta(key)
            if meta is None or meta.embedding is None or (model is not None and meta.model != model):
                continue
            sim = float(normalize(meta.embedding)[0] @ q)
            if self.matcher.same_question(text, meta, min(sim, 1.0), threshold):
                stale.add(key)
        return stale

    async def _persist(
        self, entry: Entry, announce: CacheInvalidated | None = None, *, optional: bool = False
    ) -> bool:
        """Write to L3 now if the breaker allows (with `announce` in its outbox); otherwise queue it
        (bounded) for `flush_pending`. `optional`: the caller stores the entry locally either way (a KV
        block), so a slow L3 is not waited for."""
        key = entry.key
        if key not in self._pending and self.l3 is not None:
            ran, _ = await self.l3_call(
                self.l3.put, entry, announce=announce, durable=not (self.write_behind or optional)
            )
            if ran:
                return True
        if self.l3 is None:
            return False
        if not self.write_behind:
            raise L3Unavailable(
                f"L3 did not take the write (breaker {self.breaker.state}): it is not acknowledged, since "
                "this node acknowledges only writes that survive it (retry later)"
            )
        if not self.hearing:
            # Neither L3 nor the bus: other nodes read L3 and, not told in time, would serve the value
            # this write replaces long after it was acknowledged. Refused instead (retry later).
            raise L3Unavailable("L3 is unavailable and this node does not hear invalidations")
        if key not in self._pending and len(self._pending) >= self.max_pending_l3_writes:
            raise L3Unavailable(
                f"L3 is unavailable (breaker {self.breaker.state}); "
                f"{len(self._pending)} writes are already waiting"
            )
        self._pending[key] = entry
        self._pending.move_to_end(key)
        self.counters.l3_written_behind += 1
        return False

    async def delete(self, key: str) -> bool:
        """Drop `key` everywhere (L3 too) and tell every node (delayed double delete included)."""
        at = self.clock.now()
        self.fence(key, at)
        existed = self._drop_local(key, "deleted")
        self.matcher.forget(key)
        pending = self._pending.pop(key, "absent")
        if pending not in ("absent", None):
            existed = True
        event = CacheInvalidated(key=key, reason="delete", origin_node_id=self.node_id, occurred_at_ms=at)
        if self.l3 is not None:
            ran, gone = await self.l3_call(self.l3.delete, key, announce=event, durable=not self.write_behind)
            if ran:
                existed = existed or bool(gone)
            elif not self.write_behind:
                # Not acknowledged: L3 would hand the value back once this node is gone. What was dropped
                # here goes on other nodes too, so no node keeps serving a value a client asked gone.
                self._publish_invalidation(event)
                raise L3Unavailable(
                    f"L3 did not take the delete (breaker {self.breaker.state}): it is not acknowledged "
                    "(retry later)"
                )
            else:
                self._pending[key] = None
        self.counters.deletes += 1
        self._publish_invalidation(event)
        return existed

    def _publish_invalidation(self, event: CacheInvalidated) -> None:
        self.outbox.invalidation(event)
        if self.double_delete_delay_ms >= 0:
            again = event.model_copy(update={"attempt": 2, "event_id": new_event_id()})
            self.outbox.invalidation(again, delay_ms=self.double_delete_delay_ms)

    async def flush_pending(self, max_ops: int = 100) -> int:
        """Hand queued writes/deletes to L3 while the breaker lets them through; returns how many."""
        done = 0
        while self._pending and done < max_ops and self.l3 is not None:
            key, entry = next(iter(self._pending.items()))
            try:
                if entry is None:
                    ran, _ = await self.l3_call(self.l3.delete, key)
                else:
                    ran, _ = await self.l3_call(self.l3.put, entry)
            except L3Rejected as exc:
                log.error("L3 refused a queued write; dropped", extra={"key": key, "error": str(exc)})
                ran = True
            if not ran:
                break
            if self._pending.get(key, "absent") is entry:  # not replaced meanwhile
                del self._pending[key]
            done += 1
        return done

    @property
    def pending_l3_writes(self) -> int:
        return len(self._pending)

    # --- events from other nodes and services ---------------------------------------------------

    def on_invalidated(self, event: CacheInvalidated) -> list[str]:
        """Drop local entries at least `similarity_threshold` similar to the written embedding that ask
        the same question (the guards, when the event carries the written prompt), and the key itself
        unless this node wrote it (or already holds this write or a newer one). An event applied before
        (the outbox relay sends again what it cannot know was delivered) is ignored."""
        self.counters.invalidations_received += 1
        if event.event_id in self._applied_invalidations:
            self.counters.invalidations_repeated += 1
            return []
        self._applied_invalidations[event.event_id] = None
        while len(self._applied_invalidations) > _REMEMBERED_INVALIDATIONS:
            del self._applied_invalidations[next(iter(self._applied_invalidations))]
        if event.origin_node_id != self.node_id:
            self.clock.observe(event.occurred_at_ms)
        self.fence(event.key, event.occurred_at_ms)
        candidates = {event.key}
        if event.embedding is not None and event.similarity_threshold is not None and self.dim is not None:
            if len(event.embedding) == self.dim:
                try:
                    candidates |= self._stale_neighbours(
                        event.embedding, event.similarity_threshold, event.prompt_text, event.model
                    )
                except ValueError:  # a zero vector has no cosine: the exact key still goes
                    log.warning("invalidation with an unusable embedding", extra={"key": event.key})
            else:
                log.warning(
                    "invalidation embedding has the wrong dimension; dropping the exact key only",
                    extra={"key": event.key, "dim": len(event.embedding)},
                )
        own = event.origin_node_id == self.node_id
        if not own:
            self.matcher.forget(event.key)  # its labels were about the value before this write
        dropped = []
        for key in candidates:
            if key == event.key:
                if own:
                    continue
                meta = self._local_meta(key)
                if meta is not None and meta.updated_at_ms >= event.occurred_at_ms:
                    continue
            if self._drop_local(key, "invalidated"):
                dropped.append(key)
        self.counters.invalidated_entries += len(dropped)
        return sorted(dropped)

    def _for_me(self, node_id: str | None) -> bool:
        return node_id is None or node_id == "*" or node_id == self.node_id

    def on_heat(self, event: HeatScored) -> None:
        """keep -> nothing; keep_alive -> refresh the entry in the eviction policy; evict -> drop it
        from L1 and L2 (L3 keeps the record)."""
        if not self._for_me(event.node_id):
            return
        if event.decision == "evict":
            if self._drop_local(event.key, "heat"):
                self.counters.heat_evictions += 1
        elif event.decision == "keep_alive":
            touched = self.l1.touch(event.key)
            if self.l2 is not None:
                touched = self.l2.touch(event.key) or touched
            self.counters.heat_keep_alives += touched

    async def on_command(
        self, event: WarmupRequested | PromotionRequested | EvictionRequested
    ) -> CommandReport | None:
        """Warmup / promotion: load the keys (from L2, a peer's L2, else L3) into the target tier.
        Eviction: drop them locally. None when the command is not for this node or was applied already
        (a redelivered command does nothing twice)."""
        if not self._for_me(event.node_id) or event.event_id in self._applied_commands:
            return None
        self._applied_commands[event.event_id] = None
        while len(self._applied_commands) > _REMEMBERED_COMMANDS:
            del self._applied_commands[next(iter(self._applied_commands))]
        self.counters.commands += 1
        if isinstance(event, EvictionRequested):
            return CommandReport("l1", dropped=sum(self._drop_local(k, "evicted") for k in event.keys))
        tier = event.tier if isinstance(event, WarmupRequested) else event.to_tier
        report = CommandReport(tier)
        if tier == "l3":
            return report
        to_l1 = tier == "l1"
        wanted = []
        for key in dict.fromkeys(event.keys):
            if (to_l1 and key in self.l1) or (not to_l1 and self.l2 is not None and key in self.l2):
                report.already_present += 1
                continue
            local = self.l2.get(key) if (to_l1 and self.l2 is not None and key in self.l2) else None
            if local is not None and local.meta.kind == "kv_block":
                report.already_present += 1  # KV lives in L2 (the block pool): as warm as it gets
            elif local is not None and self._admit(local, to_l2=False):
                report.loaded += 1
                report.from_l2 += 1
            else:
                wanted.append(key)
        if wanted and self.peers is not None:
            # Promoted into L1 and L2 (a peer's copy is as good as L3's).
            remote = await self.remote_entries([(k, None) for k in wanted])
            for hit in remote.values():
                self._admit(hit.entry)
            report.loaded += len(remote)
            report.from_peers += len(remote)
            wanted = [k for k in wanted if k not in remote]
        if wanted and self.l3 is not None:
            _, rows = await self.l3_call(self.l3.get_many, wanted, self.wall_ms())
            for entry in (rows or {}).values():
                if self._admit(entry, to_l1=to_l1):
                    report.loaded += 1
                    report.from_l3 += 1
            wanted = [k for k in wanted if k not in (rows or {})]
        report.missing = len(wanted)
        self.counters.warmed += report.loaded
        self.counters.warm_already_held += report.already_present
        return report

    async def on_conversation_ended(self, event: ConversationEnded) -> list[str]:
        """Entries bound to the conversation (its trace id, or listing it as a dependency) go, here
        and in L3 (idempotent: every node may do it)."""
        self.counters.conversations_ended += 1
        trace = event.trace_id
        keys = self._bound.pop(trace, set())
        self._bound_count -= len(keys)
        dropped = []
        for key in keys:
            meta = self._local_meta(key)
            if meta is not None and trace in meta.bound_to() and self._drop_local(key, "context_ended"):
                dropped.append(key)
        if self.l3 is not None:
            # Not through the breaker: this runs on the consumer, which retries a transient failure.
            for key in await self.l3.delete_bound_to(trace):
                if self._drop_local(key, "context_ended"):
                    dropped.append(key)
        self.counters.context_dropped += len(dropped)
        return sorted(dropped)

    def forget_memory(self, reason: str = "unheard") -> int:
        """Drops every entry from this node's L1 and L2 (L3 keeps them): after a time this node could
        not hear invalidations, any copy it holds may have been replaced meanwhile, and the
        invalidations buffered by other nodes' producers during a broker outage can arrive after this
        node hears again. Returns how many entries went."""
        keys = set(self.l1.keys())
        if self.l2 is not None:
            keys.update(self.l2.keys())
        gone = sum(1 for key in keys if self._drop_local(key, reason))
        self.counters.forgotten += gone
        return gone

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
        return "local_only" if self.local_only else "normal"

    def check_mode(self) -> ModeChange | None:
        """Give the degrade guard the lookups and hits since the last check; the change of mode, if any
        (the service publishes it). Lookups read the mode, not the guard: nothing on their path. A node
        without peers stays normal: local-only skips the peers' L2, so there it would change nothing."""
        if self.degrade is None or self.peers is None:
            return None
        c = self.counters
        hits = sum(c.hits.values())
        change = self.degrade.observe(hits - self._seen_hits, c.lookups - self._seen_lookups)
        self._seen_hits, self._seen_lookups = hits, c.lookups
        self.local_only = self.degrade.local_only
        if change is not None:
            log.warning(
                "serving mode changed",
                extra={"node_id": self.node_id, "mode": change.mode, "reason": change.reason},
            )
        return change

    def stats(self) -> dict[str, Any]:
        c = self.counters
        hits = sum(c.hits.values())
        l1 = self.l1.stats()
        return {
            "node_id": self.node_id,
            "degraded": self.degraded,
            "serving": "l1+l2 only (L3 circuit breaker open)" if self.degraded else "l1+l2+l3",
            "mode": self.mode,
            "local_only": {
                "enabled": self.degrade is not None and self.peers is not None,
                # why the node never goes local-only, when it does not
                "off_because": (
                    "disabled" if self.degrade is None else "no peers to skip" if self.peers is None else None
                ),
                "peers_skipped": c.peers_skipped,
                **(asdict(self.degrade.stats()) if self.degrade is not None else {}),
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
            "refine": self.refiner.stats() if self.refiner is not None else None,
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
                "pending_writes": len(self._pending),
                "written_behind": c.l3_written_behind,
            },
            "l2_remote": {
                "serving": self.l2_address,
                "hits": c.remote_hits,
                "rejected": c.remote_rejected,
                "failures": c.remote_failures,
                **(self.peers.stats() if self.peers is not None else {"peers": []}),
            },
            "outbox": asdict(self.outbox.stats()),
        }
