"""One node's tiers: placing and dropping entries on this node, copies from L2, the peers and L3 (through
its latency breaker), and the fences that keep a stale copy from being served or placed. No Kafka, no
SQL, no sockets: L3 and the peers are ports, the clocks are injected."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy.typing as npt

from policies.base import AccessMeta
from schemas.events import Tier, now_ms
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.cache import L1Cache
from services.tiers.l1.vector_index import normalize
from services.tiers.l2.blocks import Located
from services.tiers.l2.store import L2Store
from services.tiers.node.causal import CausalClock
from services.tiers.node.counters import Counters
from services.tiers.node.degrade import HitRateGuard
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import AccessRecord, Outbox
from services.tiers.node.plan import Step
from services.tiers.node.refine import Refiner
from services.tiers.ports import L3Rejected, L3Store, RemoteHit, RemoteL2, StampTaken

log = logging.getLogger(__name__)


class Placement:
    """One node's tiers and what it knows about them (fences, counters, the matcher): placing, promoting
    and dropping entries. `TieredCache` (tiered.py) holds it; `LookupExecutor` (executor.py) walks it."""

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
        peers: RemoteL2 | None = None,
        matcher: Matcher | None = None,
        degrade: HitRateGuard | None = None,
        max_fences: int = 100_000,
    ) -> None:
        self.l1 = l1
        # Which semantic candidate a lookup serves, and which neighbours a write makes stale.
        self.matcher = (
            matcher
            if matcher is not None
            else Matcher(default_similarity_tolerance=l1.default_similarity_tolerance)
        )
        self.l2 = l2
        self.l3 = l3
        self.peers = peers
        # Where this node serves its L2 pool to peers (host:port), for stats and health; set by the service.
        self.l2_address: str | None = None
        self.outbox = outbox
        self.breaker = breaker
        self.node_id = node_id
        self.wall_ms = wall_ms  # expiry, leases and access times
        # Stamps of writes and deletes, the order every node agrees on (wall time that never runs behind
        # what this node has heard of: services/tiers/node/causal.py).
        self.clock = CausalClock(wall_ms)
        self.perf_ns = perf_ns
        self.double_delete_delay_ms = double_delete_delay_ms
        self.l3_timeout_s = l3_timeout_s
        self.l3_candidates = l3_candidates
        self.dim = l1.dim
        # trace id -> keys bound to it (may hold keys already evicted; checked before use, pruned).
        self._bound: dict[str, set[str]] = {}
        self._bound_count = 0
        # key -> when the newest write (or delete) of it this node has heard of happened: a copy older
        # than that is neither served nor placed (an L3 row a write-behind has not reached, a read that
        # raced the invalidation, a peer's copy not dropped yet). The oldest are forgotten past the bound.
        self._fences: OrderedDict[str, int] = OrderedDict()
        self.max_fences = max_fences
        # Set by the service: when this node last knew it had every invalidation published (wall ms),
        # and how old that may be for its own tiers to be trusted (None: always; no Kafka here). Past
        # it a write elsewhere may be unheard of: lookups go to L3, the store of record. Placing goes on
        # (what is placed meets every invalidation once the node hears again, before it serves).
        self.heard_at_ms: int | None = None
        self.hearing_lease_ms: int | None = None
        self.counters = Counters()
        # Degrade to local-only (degrade.py): while `local_only`, lookups do not ask the peers' L2.
        self.degrade = degrade
        self.local_only = False
        # Set by the service when text lookups are screened by a cheap model (refine.py).
        self.refiner: Refiner | None = None

    # --- local tiers ----------------------------------------------------------------------------

    def fence(self, key: str, at_ms: int) -> None:
        """No copy of `key` older than `at_ms` is served or placed from now on."""
        if self._fences.get(key, -1) < at_ms:
            self._fences[key] = at_ms
            self._fences.move_to_end(key)
            while len(self._fences) > self.max_fences:
                self._fences.popitem(last=False)

    @property
    def hearing(self) -> bool:
        """Whether this node's own tiers (and its peers') may answer: it hears invalidations."""
        lease, heard = self.hearing_lease_ms, self.heard_at_ms
        return lease is None or (heard is not None and self.wall_ms() - heard <= lease)

    def fenced(self, entry: Entry) -> bool:
        at = self._fences.get(entry.key)
        return at is not None and entry.meta.updated_at_ms < at

    def admit(self, entry: Entry, *, to_l1: bool = True, to_l2: bool = True) -> tuple[Tier, ...]:
        """Place `entry` in L1 (and L2, write-through); returns where it went. A KV block goes to L2 alone
        when L2 takes values its size (the block pool is where KV lives, docs/design.md §1.1)."""
        meta = entry.meta
        self.clock.observe(meta.updated_at_ms)  # a row from L3 or a peer may come from a clock ahead
        placed: list[Tier] = []
        if meta.kind == "kv_block" and self.l2 is not None and len(entry.blob) <= self.l2.max_value_bytes:
            to_l1 = False
            to_l2 = to_l2 and meta.key not in self.l2
        ttl = meta.remaining_ttl_ms(self.wall_ms())
        if (ttl is not None and ttl <= 0) or self.fenced(entry):
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
            live = {k for k in self._bound[trace] if self.local_meta(k) is not None}
            if live:
                self._bound[trace] = live
            else:
                del self._bound[trace]
        self._bound_count = sum(len(v) for v in self._bound.values())

    def local_meta(self, key: str) -> EntryMeta | None:
        cached = self.l1.peek(key)
        if cached is not None:
            return cached.meta
        return self.l2.peek_meta(key) if self.l2 is not None else None

    def holds_exact(self, key: str, model: str | None = None) -> bool:
        """Whether this node's memory (L1/L2) holds a live entry under `key` for `model`: an exact
        lookup will be answered, so the API need not embed the request's text for a semantic step
        that would not run."""
        meta = self.local_meta(key)
        if meta is None or (model is not None and meta.model != model):
            return False
        ttl = meta.remaining_ttl_ms(self.wall_ms())
        return ttl is None or ttl > 0

    def held_locally(self, keys: Sequence[str], model: str | None = None) -> list[tuple[Tier, int]]:
        """(tier, size in bytes) of each leading key of `keys` this node's memory holds live, up to the
        first it does not: a prefix answered without reading a value (a KV block is 256 KB)."""
        out: list[tuple[Tier, int]] = []
        for key in keys:
            cached = self.l1.peek(key)
            tier: Tier = "l1"
            meta = None if cached is None else cached.meta
            if meta is None and self.l2 is not None:
                meta, tier = self.l2.peek_meta(key), "l2"
            if meta is None or (model is not None and meta.model != model):
                break
            ttl = meta.remaining_ttl_ms(self.wall_ms())
            if ttl is not None and ttl <= 0:
                break
            out.append((tier, meta.size_bytes))
        return out

    def locate_prefix(self, keys: Sequence[str], model: str | None = None) -> list[Located]:
        """Where each leading key of `keys` lies in this node's L2 pool, up to the first that is not
        there (live, for `model`): for a reader on this host that maps the pool. Each is a hit."""
        out: list[Located] = []
        if self.l2 is None:
            return out
        now = self.wall_ms()
        for key in keys:
            meta = self.l2.peek_meta(key)
            if meta is None or (model is not None and meta.model != model):
                break
            ttl = meta.remaining_ttl_ms(now)
            if ttl is not None and ttl <= 0:
                break
            located = self.l2.locate_local(key)
            if located is None:
                break
            out.append(located)
            self.counters.lookups += 1
            self.counters.hits["l2:exact"] += 1
            self.outbox.access(
                AccessRecord(
                    key, True, 0.0, now, tier="l2", match="exact", kind=meta.kind, model=meta.model,
                    size_bytes=located.nbytes, trace_id=meta.trace_id,
                )
            )  # fmt: skip
        return out

    async def entry_meta(self, key: str) -> EntryMeta | None:
        """The descriptor facts under `key`, from this node's tiers or else L3; no access is counted."""
        meta = self.local_meta(key)
        if meta is None and self.l3 is not None:
            _, entry = await self.l3_call(self.l3.get, key, self.wall_ms())
            meta = None if entry is None else entry.meta
        return meta

    def touch_local(self, key: str) -> None:
        """Count a use of `key` in the tier holding it (recency), without reading it."""
        if self.l2 is not None and self.l2.touch(key):
            return
        self.l1.touch(key)

    def drop_local(self, key: str, reason: str) -> bool:
        dropped = self.l1.remove(key, reason)
        if self.l2 is not None:
            dropped = self.l2.remove(key, reason) or dropped
        return dropped

    def unbind(self, trace: str) -> set[str]:
        """The keys placed bound to conversation `trace` (some may be gone since), forgotten here."""
        keys = self._bound.pop(trace, set())
        self._bound_count -= len(keys)
        return keys

    def stale_neighbours(
        self, embedding: npt.ArrayLike, threshold: float, text: str | None, model: str | None
    ) -> set[str]:
        """Local entries a write of prompt `text` at `embedding` for `model` makes stale: of the same
        model (a lookup never matches across models, so a write must not drop another model's or
        tenant's entry either), at least `threshold` similar, and asking the same question (no guard
        fires when both prompts are known)."""
        q = normalize(embedding)[0]
        near = set(self.l1.similar_keys(embedding, threshold))
        if self.l2 is not None:
            near.update(self.l2.similar_keys(embedding, threshold))
        stale = set()
        for key in near:
            meta = self.local_meta(key)
            if meta is None or meta.embedding is None or (model is not None and meta.model != model):
                continue
            sim = float(normalize(meta.embedding)[0] @ q)
            if self.matcher.same_question(text, meta, min(sim, 1.0), threshold):
                stale.add(key)
        return stale

    def promote(self, step: Step, entry: Entry) -> None:
        """Copy a hit of `step` into the tiers the plan says it goes to."""
        self.admit(entry, to_l1="l1" in step.promote, to_l2="l2" in step.promote)

    def l2_entry(self, key: str, model: str | None) -> Entry | None:
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
        return entry

    async def remote_entries(self, wanted: Sequence[tuple[str, str | None]]) -> dict[str, RemoteHit]:
        """Peers' L2 for (key, model) pairs the local tiers missed: the first acceptable hit per key, in
        the order asked (the caller promotes them)."""
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
            out[key] = hit
        return out

    # --- L3 through the breaker -----------------------------------------------------------------

    async def l3_call(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, durable: bool = False, **kwargs: Any
    ) -> tuple[bool, Any]:
        """(ran, result) of `fn(*args, **kwargs)` on L3: ran is False when the breaker refused or the
        call failed or timed out. `durable`: a write the client waits for, refused only while L3 fails
        (a breaker open for slowness protects lookups, not acknowledged writes)."""
        if self.l3 is None:
            return False, None
        if self.breaker.allow():
            record = self.breaker.record
        elif durable and self.breaker.allow_slow():
            record = self.breaker.record_slow
        else:
            return False, None
        started = self.perf_ns()
        try:
            async with asyncio.timeout(self.l3_timeout_s):
                result = await fn(*args, **kwargs)
        except (L3Rejected, StampTaken):
            # L3 itself answered (the data refused, or the stamp taken): not a failure of L3.
            record((self.perf_ns() - started) / 1e6, ok=True)
            raise
        except Exception as exc:  # includes TimeoutError: L3 is slow or down; serve without it
            record((self.perf_ns() - started) / 1e6, ok=False)
            self.counters.l3_errors += 1
            log.warning("L3 call failed; serving from L1/L2", extra={"error": repr(exc)})
            return False, None
        record((self.perf_ns() - started) / 1e6, ok=True)
        return True, result
