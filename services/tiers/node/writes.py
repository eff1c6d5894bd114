"""A node's writes: put (write-with-sync: L3, then its own tiers, then the invalidation for every node),
KV blocks under content keys, deletes, and the bounded write-behind queue for L3."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace

from schemas.events import CacheInvalidated, Tier
from schemas.ids import new_event_id
from services.tiers.entry import Entry, EntryMeta
from services.tiers.node.placement import Placement
from services.tiers.ports import L3Rejected, StampTaken

log = logging.getLogger(__name__)

# How often a write is stamped again when another write of its key took the stamp first (a tie needs
# two writes of one key in one millisecond; three in a row, a key written faster than L3 commits).
_STAMP_TRIES = 3


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


class Writes:
    """Writes and deletes through one node's tiers (`Placement`); owns the queue of what L3 has not taken."""

    def __init__(self, node: Placement, *, write_behind: bool = False, max_pending: int = 10_000) -> None:
        self.node = node
        # False: a write or delete is acknowledged only once L3 holds it (durable); True: also from memory
        # while L3 cannot take it, queued for L3 (best effort: lost if the node dies first).
        self.write_behind = write_behind
        self.max_pending = max_pending
        # Writes (Entry) and deletes (None) that L3 has not taken yet, oldest first.
        self._pending: OrderedDict[str, Entry | None] = OrderedDict()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def put(
        self, meta: EntryMeta, blob: bytes, *, invalidate_threshold: float | None = None
    ) -> PutResult:
        """Write-with-sync (docs/design.md §1.3): L3, then L1/L2, then the invalidation for every node."""
        node = self.node
        if meta.embedding is not None and node.dim is not None and meta.embedding.shape != (node.dim,):
            raise ValueError(f"embedding has shape {meta.embedding.shape}; this cache uses ({node.dim},)")
        threshold = invalidate_threshold
        if threshold is None:
            threshold = node.matcher.write_threshold(meta)
        for _ in range(_STAMP_TRIES):
            now = node.clock.now()
            entry = Entry(replace(meta, created_at_ms=now, updated_at_ms=now, size_bytes=len(blob)), blob)
            event = self._announcement(entry.meta, threshold, now)
            try:
                # L3 records the invalidation with the write (its outbox): every node hears of an
                # acknowledged write even if this node dies or loses the broker before it publishes.
                persisted = await self._persist(entry, event)  # raises when refused: nothing changed
                break
            except StampTaken as taken:
                # Another write of the key got this very stamp: stamp again, one past it.
                node.clock.observe(taken.stamp_ms)
                node.counters.stamps_retaken += 1
        else:
            raise L3Unavailable(f"{_STAMP_TRIES} writes of {meta.key!r} took each stamp first (retry later)")
        meta = entry.meta
        # From now on no older copy is served or placed (one placed while L3 wrote is dropped below).
        node.fence(meta.key, now)
        dropped: set[str] = set()
        if meta.embedding is not None:
            dropped = node.stale_neighbours(meta.embedding, threshold, meta.prompt_text, meta.model) - {
                meta.key
            }
            for key in dropped:
                node.drop_local(key, "invalidated")
        node.drop_local(meta.key, "replaced")
        node.matcher.forget(meta.key)
        tiers = node.admit(entry)
        if persisted:
            tiers = (*tiers, "l3")
        node.counters.puts += 1
        node.counters.invalidated_entries += len(dropped)
        self._publish_invalidation(event)
        return PutResult(meta.key, len(blob), tiers, persisted, tuple(sorted(dropped)), now)

    def _announcement(self, meta: EntryMeta, threshold: float, now: int) -> CacheInvalidated:
        """The invalidation a write of `meta` stamped `now` owes every node."""
        return CacheInvalidated(
            key=meta.key,
            reason="write",
            model=meta.model,
            embedding=None if meta.embedding is None else meta.embedding.astype(float).tolist(),
            similarity_threshold=threshold if meta.embedding is not None else None,
            trace_id=meta.trace_id,
            origin_node_id=self.node.node_id,
            attempt=1,
            occurred_at_ms=now,
            prompt_text=meta.prompt_text if meta.embedding is not None else None,
        )

    async def put_blocks(self, items: list[tuple[EntryMeta, bytes]]) -> list[BlockPut]:
        """KV blocks under content keys (cachemesh_client/kvkeys.py): a key and a model (the connector's
        tag names the weights) name the bytes, so a block this node holds already for that model is left
        as it is, and a new one goes to L3 and L2, replacing one of other weights under the key, without
        invalidating anything else (a block under the same key and model elsewhere is the same block).
        A block is still cached when L3 cannot take it now (written behind, or not at all: a cache may
        forget a block)."""
        node = self.node
        out = []
        for meta, blob in items:
            if node.holds_exact(meta.key, meta.model):
                node.touch_local(meta.key)
                out.append(BlockPut(meta.key, "present", ()))
                continue
            now = node.clock.now()
            entry = Entry(replace(meta, created_at_ms=now, updated_at_ms=now, size_bytes=len(blob)), blob)
            try:
                persisted = await self._persist(entry, optional=True)
            except (L3Unavailable, L3Rejected, StampTaken):  # a tie: another node's copy of the block
                persisted = False
            node.drop_local(meta.key, "replaced")  # a block of other weights under this key, if any
            tiers = node.admit(entry)
            node.counters.puts += 1
            out.append(BlockPut(meta.key, "stored", (*tiers, "l3") if persisted else tiers))
        return out

    async def _persist(
        self, entry: Entry, announce: CacheInvalidated | None = None, *, optional: bool = False
    ) -> bool:
        """Write to L3 now if the breaker allows (with `announce` in its outbox); otherwise queue it
        (bounded) for `flush_pending`. `optional`: the caller stores the entry locally either way (a KV
        block), so a slow L3 is not waited for."""
        node, key = self.node, entry.key
        if node.l3 is None:
            return False
        if key not in self._pending:
            ran, _ = await node.l3_call(
                node.l3.put, entry, announce=announce, durable=not (self.write_behind or optional)
            )
            if ran:
                return True
        if not self.write_behind:
            raise L3Unavailable(
                f"L3 did not take the write (breaker {node.breaker.state}): it is not acknowledged, since "
                "this node acknowledges only writes that survive it (retry later)"
            )
        if not node.hearing:
            # Neither L3 nor the bus: other nodes read L3 and, not told in time, would serve the value
            # this write replaces long after it was acknowledged. Refused instead (retry later).
            raise L3Unavailable("L3 is unavailable and this node does not hear invalidations")
        if key not in self._pending and len(self._pending) >= self.max_pending:
            raise L3Unavailable(
                f"L3 is unavailable (breaker {node.breaker.state}); "
                f"{len(self._pending)} writes are already waiting"
            )
        self._pending[key] = entry
        self._pending.move_to_end(key)
        node.counters.l3_written_behind += 1
        return False

    async def delete(self, key: str) -> bool:
        """Drop `key` everywhere (L3 too) and tell every node (delayed double delete included)."""
        node = self.node
        at = node.clock.now()
        node.fence(key, at)
        existed = node.drop_local(key, "deleted")
        node.matcher.forget(key)
        pending = self._pending.pop(key, "absent")
        if pending not in ("absent", None):
            existed = True
        event = CacheInvalidated(key=key, reason="delete", origin_node_id=node.node_id, occurred_at_ms=at)
        if node.l3 is not None:
            ran, gone = await node.l3_call(node.l3.delete, key, announce=event, durable=not self.write_behind)
            if ran:
                existed = existed or bool(gone)
            elif not self.write_behind:
                # Not acknowledged: L3 would hand the value back once this node is gone. What was dropped
                # here goes on other nodes too, so no node keeps serving a value a client asked gone.
                self._publish_invalidation(event)
                raise L3Unavailable(
                    f"L3 did not take the delete (breaker {node.breaker.state}): it is not acknowledged "
                    "(retry later)"
                )
            else:
                self._pending[key] = None
        node.counters.deletes += 1
        self._publish_invalidation(event)
        return existed

    def _publish_invalidation(self, event: CacheInvalidated) -> None:
        node = self.node
        node.outbox.invalidation(event)
        if node.double_delete_delay_ms >= 0:
            again = event.model_copy(update={"attempt": 2, "event_id": new_event_id()})
            node.outbox.invalidation(again, delay_ms=node.double_delete_delay_ms)

    async def flush_pending(self, max_ops: int = 100) -> int:
        """Hand queued writes/deletes to L3 while the breaker lets them through; returns how many."""
        node, done = self.node, 0
        while self._pending and done < max_ops and node.l3 is not None:
            key, entry = next(iter(self._pending.items()))
            try:
                if entry is None:
                    ran, _ = await node.l3_call(node.l3.delete, key)
                else:
                    ran, _ = await node.l3_call(node.l3.put, entry)
            except L3Rejected as exc:
                log.error("L3 refused a queued write; dropped", extra={"key": key, "error": str(exc)})
                ran = True
            except StampTaken:
                # Another write of the key has this one's stamp and is in L3: that one stands, and this
                # node's copy goes, so that every node reads the same (its invalidation went out).
                node.drop_local(key, "replaced")
                ran = True
            if not ran:
                break
            if self._pending.get(key, "absent") is entry:  # not replaced meanwhile
                del self._pending[key]
            done += 1
        return done
