"""The tiered cache: one node's L1 (cuckoo + vector index), L2 (block pool) and L3 (a `L3Store` port),
and the rules that tie them together (DESIGN.md §1-§3, seed §1.1, §1.3, §4.4).

- get walks L1 -> L2 -> L3, the exact key before the embedding in each tier (L2 is exact-key only):
  L1 exact, L1 semantic, L2 exact, other nodes' L2 exact (the `RemoteL2` port: peers' block pools), L3
  exact, L3 semantic; a hit below L1 is promoted into L1 (and L2). A remote hit is tier "l2" with
  `remote` set; a peer that fails or is slow only costs its timeout, and the lookup goes on to L3.
- put (write-with-sync, seed §1.3): L3 first (the store of record), then L1 and L2; entries on this
  node at least `similarity_tolerance` similar go at once; a `CacheInvalidated` (key, embedding,
  threshold, trace id) is queued for every node, and again `double_delete_delay_ms` later (delayed
  double delete, seed §4.4). Access records are queued for `cache.access.v1`. Nothing here waits on
  Kafka: the outbox is drained by the service.
- L3 sits behind a latency circuit breaker (seed §4.4: open when its P99 > 150 ms); while it is open
  lookups are served from L1/L2 only (`degraded`) and writes wait in a bounded write-behind queue.
- Events from other services: invalidations, heat decisions, tier commands, conversation ends.

No Kafka, no SQL, no sockets here: L3 and the peers are injected ports, events go to the `Outbox`; the
clocks are injected.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from policies.base import AccessMeta
from schemas.events import (
    CacheInvalidated,
    ConversationEnded,
    EvictionRequested,
    HeatScored,
    PromotionRequested,
    Tier,
    WarmupRequested,
    new_event_id,
    now_ms,
)
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.store import L2Store
from services.tiers.l3.breaker import LatencyBreaker
from services.tiers.node.outbox import AccessRecord, Outbox
from services.tiers.ports import L3Rejected, L3Store, RemoteHit, RemoteL2

log = logging.getLogger(__name__)

T = TypeVar("T")
Match = Literal["exact", "semantic"]


class L3Unavailable(RuntimeError):
    """L3 is behind an open breaker and the write-behind queue is full."""


@dataclass(frozen=True, slots=True)
class Lookup:
    entry: Entry | None
    tier: Tier | None = None
    match: Match | None = None
    similarity: float | None = None
    latency_us: float = 0.0
    # True when L3 was skipped (breaker open) or failed: the answer came from L1/L2 only.
    degraded: bool = False
    # The hit came from another node's L2 (tier "l2"), the block server at `peer`.
    remote: bool = False
    peer: str | None = None

    @property
    def hit(self) -> bool:
        return self.entry is not None


@dataclass(frozen=True, slots=True)
class Query:
    """One lookup: an exact key, an embedding, or both (exact first)."""

    key: str | None = None
    embedding: np.ndarray | None = None
    model: str | None = None
    tolerance: float | None = None
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class PutResult:
    key: str
    size_bytes: int
    tiers: tuple[Tier, ...]
    persisted: bool  # False: waiting in the write-behind queue (L3 breaker open or L3 failing)
    invalidated_local: tuple[str, ...]
    updated_at_ms: int


@dataclass
class _Counters:
    lookups: int = 0
    hits: Counter[str] = field(default_factory=Counter)  # "l1:exact", "l3:semantic", ...
    misses: int = 0
    degraded_lookups: int = 0
    puts: int = 0
    deletes: int = 0
    invalidations_received: int = 0
    invalidated_entries: int = 0
    heat_evictions: int = 0
    heat_keep_alives: int = 0
    commands: int = 0
    warmed: int = 0
    conversations_ended: int = 0
    context_dropped: int = 0
    l3_errors: int = 0
    l3_written_behind: int = 0
    remote_hits: int = 0
    remote_rejected: int = 0  # found on a peer but expired or of another model
    remote_failures: int = 0  # the port raised (it should not): counted, the lookup went on


def embedding_key(embedding: npt.ArrayLike) -> str:
    """A stable key for an embedding-only lookup (access events need one)."""
    raw = np.ascontiguousarray(embedding, dtype=np.float32).tobytes()
    return "emb:" + hashlib.blake2b(raw, digest_size=12).hexdigest()


class TieredCache:
    def __init__(
        self,
        *,
        l1: L1Cache,
        l2: L2Store | None,
        l3: L3Store | None,
        outbox: Outbox,
        breaker: LatencyBreaker,
        node_id: str,
        wall_ms: Callable[[], int] = now_ms,
        perf_ns: Callable[[], int] = time.perf_counter_ns,
        double_delete_delay_ms: int = 200,
        l3_timeout_s: float = 1.0,
        l3_candidates: int = 4,
        max_pending_l3_writes: int = 10_000,
        peers: RemoteL2 | None = None,
    ) -> None:
        self.l1 = l1
        self.l2 = l2
        self.l3 = l3
        self.peers = peers
        # Where this node serves its L2 pool to peers (host:port), for stats and health; set by the service.
        self.l2_address: str | None = None
        self.outbox = outbox
        self.breaker = breaker
        self.node_id = node_id
        self.wall_ms = wall_ms
        self.perf_ns = perf_ns
        self.double_delete_delay_ms = double_delete_delay_ms
        self.l3_timeout_s = l3_timeout_s
        self.l3_candidates = l3_candidates
        self.max_pending_l3_writes = max_pending_l3_writes
        self.dim = l1.dim
        # Writes (Entry) and deletes (None) that L3 has not taken yet, oldest first.
        self._pending: OrderedDict[str, Entry | None] = OrderedDict()
        # trace id -> keys bound to it (may hold keys already evicted; checked before use, pruned).
        self._bound: dict[str, set[str]] = {}
        self._bound_count = 0
        self.counters = _Counters()

    # --- local tiers ----------------------------------------------------------------------------

    def _admit(self, entry: Entry, *, to_l1: bool = True, to_l2: bool = True) -> tuple[Tier, ...]:
        """Place `entry` in L1 (and L2, write-through); returns where it went."""
        meta = entry.meta
        placed: list[Tier] = []
        ttl = meta.remaining_ttl_ms(self.wall_ms())
        if ttl is not None and ttl <= 0:
            return ()
        if to_l1:
            decisions = self.l1.put(
                meta.key,
                entry,
                size_bytes=len(entry.blob),
                embedding=meta.embedding,
                ttl_hint_ms=ttl,
                similarity_tolerance=meta.similarity_tolerance,
                model=meta.model,
                meta=AccessMeta(trace_id=meta.trace_id, ttl_ms=ttl),
            )
            if not any(d.key == meta.key and d.reason == "rejected" for d in decisions):
                placed.append("l1")
        if to_l2 and self.l2 is not None and self.l2.put(entry):
            placed.append("l2")
        bound = meta.bound_to()
        if bound and placed:
            for trace in bound:
                self._bound.setdefault(trace, set()).add(meta.key)
                self._bound_count += 1
            if self._bound_count > 2 * (self.l1.max_entries + len(self.l2 or ())) + 1024:
                self._prune_bound()
        return tuple(placed)

    def _prune_bound(self) -> None:
        for trace in list(self._bound):
            live = {k for k in self._bound[trace] if self._local_meta(k) is not None}
            if live:
                self._bound[trace] = live
            else:
                del self._bound[trace]
        self._bound_count = sum(len(v) for v in self._bound.values())

    def _local_meta(self, key: str) -> EntryMeta | None:
        cached = self.l1.peek(key)
        if cached is not None:
            return cached.meta
        return self.l2.peek_meta(key) if self.l2 is not None else None

    def _drop_local(self, key: str, reason: str) -> bool:
        dropped = self.l1.remove(key, reason)
        if self.l2 is not None:
            dropped = self.l2.remove(key, reason) or dropped
        return dropped

    def _similar_local(self, embedding: npt.ArrayLike, threshold: float) -> set[str]:
        keys = set(self.l1.similar_keys(embedding, threshold))
        if self.l2 is not None:
            keys.update(self.l2.similar_keys(embedding, threshold))
        return keys

    def _l1_entry(self, key: str, model: str | None) -> Entry | None:
        cached = self.l1.get(key)
        if cached is None or (model is not None and cached.meta.model != model):
            return None
        return cached

    def _l2_entry(self, key: str, model: str | None) -> Entry | None:
        if self.l2 is None or key not in self.l2:
            return None
        entry = self.l2.get(key)
        if entry is None:
            return None
        ttl = entry.meta.remaining_ttl_ms(self.wall_ms())
        if ttl is not None and ttl <= 0:
            self.l2.remove(key, "expired")
            return None
        if model is not None and entry.meta.model != model:
            return None
        self._admit(entry, to_l2=False)
        return entry

    async def _remote_entries(self, wanted: Sequence[tuple[str, str | None]]) -> dict[str, RemoteHit]:
        """Peers' L2 for (key, model) pairs the local tiers missed; hits are promoted here (L1 and L2)."""
        if self.peers is None or not wanted:
            return {}
        try:
            found = await self.peers.fetch_many(list(dict.fromkeys(k for k, _ in wanted)))
        except Exception as exc:  # the port promises not to raise; a lookup never fails on a peer
            self.counters.remote_failures += 1
            log.warning("peer L2 lookup failed; going on to L3", extra={"error": repr(exc)})
            return {}
        out: dict[str, RemoteHit] = {}
        now = self.wall_ms()
        for key, model in wanted:
            hit = found.get(key)
            if hit is None:
                continue
            meta = hit.entry.meta
            ttl = meta.remaining_ttl_ms(now)
            if (
                meta.key != key
                or (ttl is not None and ttl <= 0)
                or (model is not None and meta.model != model)
            ):
                self.counters.remote_rejected += 1
                continue
            if key not in out:
                self._promote(hit.entry)
            out[key] = hit
        return out

    # --- L3 through the breaker -----------------------------------------------------------------

    async def _l3_call(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> tuple[bool, Any]:
        """(ran, result) of `fn(*args, **kwargs)` on L3: ran is False when the breaker refused or the
        call failed or timed out."""
        if self.l3 is None or not self.breaker.allow():
            return False, None
        started = self.perf_ns()
        try:
            async with asyncio.timeout(self.l3_timeout_s):
                result = await fn(*args, **kwargs)
        except L3Rejected:
            # The data was refused, L3 itself answered: not a failure of L3, and not worth a retry.
            self.breaker.record((self.perf_ns() - started) / 1e6, ok=True)
            raise
        except Exception as exc:  # includes TimeoutError: L3 is slow or down; serve without it
            self.breaker.record((self.perf_ns() - started) / 1e6, ok=False)
            self.counters.l3_errors += 1
            log.warning("L3 call failed; serving from L1/L2", extra={"error": repr(exc)})
            return False, None
        self.breaker.record((self.perf_ns() - started) / 1e6, ok=True)
        return True, result

    def _promote(self, entry: Entry) -> None:
        self._admit(entry)

    # --- reads ----------------------------------------------------------------------------------

    def get_local(self, key: str, model: str | None = None) -> Lookup:
        """L1 then L2 by exact key, synchronously (the in-process fast path); records the access."""
        started = self.perf_ns()
        entry = self._l1_entry(key, model)
        tier: Tier | None = "l1"
        if entry is None:
            entry = self._l2_entry(key, model)
            tier = "l2" if entry is not None else None
        return self._finish(key, None, entry, tier, "exact" if entry else None, 1.0, started, False, None)

    async def get(
        self,
        key: str | None = None,
        embedding: npt.ArrayLike | None = None,
        *,
        model: str | None = None,
        tolerance: float | None = None,
        trace_id: str | None = None,
    ) -> Lookup:
        if key is None and embedding is None:
            raise ValueError("a lookup needs a key, an embedding, or both")
        started = self.perf_ns()
        degraded = False
        found: tuple[Entry, Tier, Match, float] | None = None
        vec = None if embedding is None else np.asarray(embedding, dtype=np.float32)
        # Tier by tier, exact key before embedding in each: an acceptable answer from memory never
        # waits on a Postgres round trip.
        if key is not None and (entry := self._l1_entry(key, model)) is not None:
            found = (entry, "l1", "exact", 1.0)
        if found is None and vec is not None:
            near = self.l1.get_semantic(vec, tolerance=tolerance, model=model)
            if near is not None:
                found = (near.value, "l1", "semantic", near.similarity)
        if found is None and key is not None and (entry := self._l2_entry(key, model)) is not None:
            found = (entry, "l2", "exact", 1.0)
        peer: str | None = None
        if found is None and key is not None and self.peers is not None:
            remote = (await self._remote_entries([(key, model)])).get(key)
            if remote is not None:
                found, peer = (remote.entry, "l2", "exact", 1.0), remote.peer
        if found is None and self.l3 is not None:
            l3, now = self.l3, self.wall_ms()
            semantic = vec is not None and l3.semantic
            hit: tuple[Entry, Match, float] | None = None
            if key is not None and semantic:  # both legs in one call: one round trip where it can
                ran, hit = await self._l3_call(
                    l3.find, key, vec, now, model=model, tolerance=tolerance, candidates=self.l3_candidates
                )
            elif key is not None:
                ran, row = await self._l3_call(l3.get, key, now)
                if row is not None and (model is None or row.meta.model == model):
                    hit = (row, "exact", 1.0)
            elif semantic:
                ran, m = await self._l3_call(
                    l3.search, vec, now, model=model, tolerance=tolerance, candidates=self.l3_candidates
                )
                hit = None if m is None else (m.entry, "semantic", m.similarity)
            else:
                ran = True
            degraded = not ran
            if hit is not None:
                self._promote(hit[0])
                found = (hit[0], "l3", hit[1], hit[2])
        entry, tier, how, sim = found or (None, None, None, None)
        return self._finish(key, embedding, entry, tier, how, sim, started, degraded, trace_id, peer)

    def _finish(
        self,
        key: str | None,
        embedding: npt.ArrayLike | None,
        entry: Entry | None,
        tier: Tier | None,
        match: Match | None,
        sim: float | None,
        started_ns: int,
        degraded: bool,
        trace_id: str | None,
        peer: str | None = None,
    ) -> Lookup:
        latency_us = (self.perf_ns() - started_ns) / 1e3
        c = self.counters
        c.lookups += 1
        c.degraded_lookups += degraded
        if entry is None:
            c.misses += 1
            record_key = key if key is not None else embedding_key(embedding)  # type: ignore[arg-type]
            self.outbox.access(
                AccessRecord(record_key, False, latency_us / 1e3, self.wall_ms(), trace_id=trace_id)
            )
            return Lookup(None, latency_us=latency_us, degraded=degraded)
        c.hits[f"{tier}:{match}" + (":remote" if peer is not None else "")] += 1
        c.remote_hits += peer is not None
        meta = entry.meta
        self.outbox.access(
            AccessRecord(
                meta.key,
                True,
                latency_us / 1e3,
                self.wall_ms(),
                tier=tier,
                match=match,
                similarity=sim,
                kind=meta.kind,
                model=meta.model,
                size_bytes=len(entry.blob),
                trace_id=trace_id or meta.trace_id,
            )
        )
        return Lookup(entry, tier, match, sim, latency_us, degraded, peer is not None, peer)

    async def get_many(self, queries: Sequence[Query]) -> list[Lookup]:
        """Batched lookups in the same tier order as `get`: one vectorised L1 probe for the exact keys,
        one for the embeddings (per model and tolerance), L2, one L3 query for the exact misses, then
        L3 searches for the rest."""
        started = self.perf_ns()
        n = len(queries)
        found: list[tuple[Entry, Tier, Match, float] | None] = [None] * n
        degraded = [False] * n
        keyed = [i for i, q in enumerate(queries) if q.key is not None]
        if keyed:
            values = self.l1.get_many([queries[i].key for i in keyed])  # type: ignore[misc]
            for i, cached in zip(keyed, values, strict=True):
                q = queries[i]
                if cached is not None and (q.model is None or cached.meta.model == q.model):
                    found[i] = (cached, "l1", "exact", 1.0)
        semantic = [i for i, q in enumerate(queries) if found[i] is None and q.embedding is not None]
        groups: dict[tuple[str | None, float | None], list[int]] = {}
        for i in semantic:
            groups.setdefault((queries[i].model, queries[i].tolerance), []).append(i)
        for (model, tolerance), idx in groups.items():
            hits = self.l1.get_semantic_many(
                np.stack([queries[i].embedding for i in idx]),  # type: ignore[misc]
                tolerance=tolerance,
                model=model,
            )
            for i, hit in zip(idx, hits, strict=True):
                if hit is not None:
                    found[i] = (hit.value, "l1", "semantic", hit.similarity)
        missing = [i for i in keyed if found[i] is None]
        for i in missing:
            q = queries[i]
            entry = self._l2_entry(q.key, q.model)  # type: ignore[arg-type]
            if entry is not None:
                found[i] = (entry, "l2", "exact", 1.0)
        missing = [i for i in missing if found[i] is None]
        peers: dict[int, str] = {}
        if missing and self.peers is not None:
            keyed_missing = [(str(queries[i].key), queries[i].model) for i in missing]
            remote = await self._remote_entries(keyed_missing)
            for i, (key, model) in zip(missing, keyed_missing, strict=True):
                got = remote.get(key)
                if got is not None and (model is None or got.entry.meta.model == model):
                    found[i], peers[i] = (got.entry, "l2", "exact", 1.0), got.peer
            missing = [i for i in missing if found[i] is None]
        if missing and self.l3 is not None:
            keys = list({queries[i].key for i in missing})
            ran, rows = await self._l3_call(self.l3.get_many, keys, self.wall_ms())
            for i in missing:
                q = queries[i]
                entry = (rows or {}).get(q.key)
                degraded[i] = not ran
                if entry is not None and (q.model is None or entry.meta.model == q.model):
                    self._promote(entry)
                    found[i] = (entry, "l3", "exact", 1.0)
        rest = [i for i in semantic if found[i] is None]
        if rest and self.l3 is not None and self.l3.semantic:
            results = []
            for i in rest:  # sequential: the pool is shared with request paths, and the breaker counts each
                q = queries[i]
                results.append(
                    await self._l3_call(
                        self.l3.search,
                        q.embedding,
                        self.wall_ms(),
                        model=q.model,
                        tolerance=q.tolerance,
                        candidates=self.l3_candidates,
                    )
                )
            for i, (ran, match) in zip(rest, results, strict=True):
                degraded[i] = degraded[i] or not ran
                if match is not None:
                    self._promote(match.entry)
                    found[i] = (match.entry, "l3", "semantic", match.similarity)
        out = []
        for i, q in enumerate(queries):
            entry, tier, match, sim = found[i] or (None, None, None, None)
            out.append(
                self._finish(
                    q.key,
                    q.embedding,
                    entry,
                    tier,
                    match,
                    sim,
                    started,
                    degraded[i],
                    q.trace_id,
                    peers.get(i),
                )
            )
        return out

    # --- writes ---------------------------------------------------------------------------------

    async def put(
        self, meta: EntryMeta, blob: bytes, *, invalidate_threshold: float | None = None
    ) -> PutResult:
        """Write-with-sync (seed §1.3): L3, then L1/L2, then the invalidation for every node."""
        if meta.embedding is not None and self.dim is not None and meta.embedding.shape != (self.dim,):
            raise ValueError(f"embedding has shape {meta.embedding.shape}; this cache uses ({self.dim},)")
        now = self.wall_ms()
        meta = replace(meta, created_at_ms=now, updated_at_ms=now, size_bytes=len(blob))
        entry = Entry(meta, blob)
        persisted = await self._persist(entry)
        threshold = meta.similarity_tolerance if invalidate_threshold is None else invalidate_threshold
        dropped: set[str] = set()
        if meta.embedding is not None:
            dropped = self._similar_local(meta.embedding, threshold) - {meta.key}
            for key in dropped:
                self._drop_local(key, "invalidated")
        self._drop_local(meta.key, "replaced")
        tiers = self._admit(entry)
        if persisted:
            tiers = (*tiers, "l3")
        self.counters.puts += 1
        self.counters.invalidated_entries += len(dropped)
        self._publish_invalidation(
            CacheInvalidated(
                key=meta.key,
                reason="write",
                model=meta.model,
                embedding=None if meta.embedding is None else meta.embedding.astype(float).tolist(),
                similarity_threshold=threshold if meta.embedding is not None else None,
                trace_id=meta.trace_id,
                origin_node_id=self.node_id,
                attempt=1,
                occurred_at_ms=now,
            )
        )
        return PutResult(meta.key, len(blob), tiers, persisted, tuple(sorted(dropped)), now)

    async def _persist(self, entry: Entry) -> bool:
        """Write to L3 now if the breaker allows; otherwise queue it (bounded) for `flush_pending`."""
        key = entry.key
        if key not in self._pending and self.l3 is not None:
            ran, _ = await self._l3_call(self.l3.put, entry)
            if ran:
                return True
        if self.l3 is None:
            return False
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
        existed = self._drop_local(key, "deleted")
        pending = self._pending.pop(key, "absent")
        if pending not in ("absent", None):
            existed = True
        if self.l3 is not None:
            ran, gone = await self._l3_call(self.l3.delete, key)
            if ran:
                existed = existed or bool(gone)
            else:
                self._pending[key] = None
        self.counters.deletes += 1
        event = CacheInvalidated(
            key=key, reason="delete", origin_node_id=self.node_id, occurred_at_ms=self.wall_ms()
        )
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
                    ran, _ = await self._l3_call(self.l3.delete, key)
                else:
                    ran, _ = await self._l3_call(self.l3.put, entry)
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
        """Drop local entries at least `similarity_threshold` similar to the written embedding, and the
        key itself unless this node wrote it (or already holds this write or a newer one)."""
        self.counters.invalidations_received += 1
        candidates = {event.key}
        if event.embedding is not None and event.similarity_threshold is not None and self.dim is not None:
            if len(event.embedding) == self.dim:
                try:
                    candidates |= self._similar_local(event.embedding, event.similarity_threshold)
                except ValueError:  # a zero vector has no cosine: the exact key still goes
                    log.warning("invalidation with an unusable embedding", extra={"key": event.key})
            else:
                log.warning(
                    "invalidation embedding has the wrong dimension; dropping the exact key only",
                    extra={"key": event.key, "dim": len(event.embedding)},
                )
        own = event.origin_node_id == self.node_id
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

    async def on_command(self, event: WarmupRequested | PromotionRequested | EvictionRequested) -> int:
        """Warmup / promotion: load the keys (from L2, else L3) into the target tier. Eviction: drop
        them locally. Returns how many keys it acted on."""
        if not self._for_me(event.node_id):
            return 0
        self.counters.commands += 1
        if isinstance(event, EvictionRequested):
            return sum(self._drop_local(k, "evicted") for k in event.keys)
        tier = event.tier if isinstance(event, WarmupRequested) else event.to_tier
        if tier == "l3":
            return 0
        to_l1 = tier == "l1"
        done = 0
        wanted = []
        for key in dict.fromkeys(event.keys):
            if to_l1 and key in self.l1:
                continue
            if not to_l1 and self.l2 is not None and key in self.l2:
                continue
            local = self.l2.get(key) if (to_l1 and self.l2 is not None and key in self.l2) else None
            if local is not None:
                done += bool(self._admit(local, to_l2=False))
            else:
                wanted.append(key)
        if wanted and self.peers is not None:
            # Promoted into L1 and L2 here as they arrive (a peer's copy is as good as L3's).
            remote = await self._remote_entries([(k, None) for k in wanted])
            done += len(remote)
            wanted = [k for k in wanted if k not in remote]
        if wanted and self.l3 is not None:
            _, rows = await self._l3_call(self.l3.get_many, wanted, self.wall_ms())
            for entry in (rows or {}).values():
                done += bool(self._admit(entry, to_l1=to_l1))
        self.counters.warmed += done
        return done

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

    # --- housekeeping ---------------------------------------------------------------------------

    def expire(self) -> int:
        gone = len(self.l1.expire())
        if self.l2 is not None:
            gone += len(self.l2.expire(self.wall_ms()))
        return gone

    @property
    def degraded(self) -> bool:
        return self.breaker.state != "closed"

    def stats(self) -> dict[str, Any]:
        c = self.counters
        hits = sum(c.hits.values())
        l1 = self.l1.stats()
        return {
            "node_id": self.node_id,
            "degraded": self.degraded,
            "serving": "l1+l2 only (L3 circuit breaker open)" if self.degraded else "l1+l2+l3",
            "lookups": c.lookups,
            "hits": hits,
            "misses": c.misses,
            "hit_rate": hits / c.lookups if c.lookups else None,
            "hits_by_tier": dict(c.hits),
            "degraded_lookups": c.degraded_lookups,
            "puts": c.puts,
            "deletes": c.deletes,
            "invalidations_received": c.invalidations_received,
            "invalidated_entries": c.invalidated_entries,
            "heat": {"evictions": c.heat_evictions, "keep_alives": c.heat_keep_alives},
            "commands": c.commands,
            "warmed": c.warmed,
            "conversations_ended": c.conversations_ended,
            "context_dropped": c.context_dropped,
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
