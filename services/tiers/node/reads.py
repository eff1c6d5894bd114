"""The tiers of one node and the read side of the tiered cache: placing and dropping entries on this node,
L3 through its latency breaker, and the executor of the lookup plan (plan.py) behind `get`, `get_many`
and `get_local`. No Kafka, no SQL, no sockets: L3 and the peers are ports, the clocks are injected."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from matching.decision import MatchResult, Verdict
from policies.base import AccessMeta
from schemas.events import Tier, now_ms
from services.runtime.breaker import LatencyBreaker
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.blocks import Located
from services.tiers.l2.store import L2Store
from services.tiers.node.causal import CausalClock
from services.tiers.node.counters import Counters
from services.tiers.node.degrade import HitRateGuard
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import AccessRecord, Outbox
from services.tiers.node.plan import LOCAL_PLAN, PLAN, Lookup, Match, Offer, Pending, Query, Step, Walk
from services.tiers.node.refine import Refiner, rescore, unsettled
from services.tiers.ports import L3Rejected, L3Store, RemoteHit, RemoteL2

log = logging.getLogger(__name__)

# A semantic lookup that found nothing near enough to decide on.
_NO_CANDIDATE = MatchResult(Verdict.MISS, 0.0, float("inf"), "no cached entry came near enough to decide on")


def embedding_key(embedding: npt.ArrayLike) -> str:
    """A stable key for an embedding-only lookup (access events need one)."""
    raw = np.ascontiguousarray(embedding, dtype=np.float32).tobytes()
    return "emb:" + hashlib.blake2b(raw, digest_size=12).hexdigest()


class TierReads:
    """One node's tiers and the lookups over them; `TieredCache` (tiered.py) adds writes, events and
    stats."""

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
        write_behind: bool = False,
        peers: RemoteL2 | None = None,
        matcher: Matcher | None = None,
        degrade: HitRateGuard | None = None,
        max_fences: int = 100_000,
    ) -> None:
        self.l1 = l1
        # Which semantic candidate a lookup serves, and which neighbours a write makes stale.
        self.matcher = matcher if matcher is not None else Matcher(default_tolerance=l1.default_tolerance)
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
        self.max_pending_l3_writes = max_pending_l3_writes
        # False: a write or delete is acknowledged only once L3 holds it (durable); True: also from memory
        # while L3 cannot take it, queued for L3 (best effort: lost if the node dies first).
        self.write_behind = write_behind
        self.dim = l1.dim
        # Writes (Entry) and deletes (None) that L3 has not taken yet, oldest first.
        self._pending: OrderedDict[str, Entry | None] = OrderedDict()
        # trace id -> keys bound to it (may hold keys already evicted; checked before use, pruned).
        self._bound: dict[str, set[str]] = {}
        self._bound_count = 0
        # Ids of tier commands applied, oldest first (TieredCache.on_command refuses a redelivery).
        self._applied_commands: dict[str, None] = {}
        # Ids of invalidations applied, oldest first: the outbox relay may send one again.
        self._applied_invalidations: dict[str, None] = {}
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
        self._seen_hits = self._seen_lookups = 0  # the counters at the guard's last tick
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

    def _fenced(self, entry: Entry) -> bool:
        at = self._fences.get(entry.key)
        return at is not None and entry.meta.updated_at_ms < at

    def _admit(self, entry: Entry, *, to_l1: bool = True, to_l2: bool = True) -> tuple[Tier, ...]:
        """Place `entry` in L1 (and L2, write-through); returns where it went. A KV block goes to L2 alone
        when L2 takes values its size (the block pool is where KV lives, DESIGN.md §1)."""
        meta = entry.meta
        self.clock.observe(meta.updated_at_ms)  # a row from L3 or a peer may come from a clock ahead
        placed: list[Tier] = []
        if meta.kind == "kv_block" and self.l2 is not None and len(entry.blob) <= self.l2.max_value_bytes:
            to_l1 = False
            to_l2 = to_l2 and meta.key not in self.l2
        ttl = meta.remaining_ttl_ms(self.wall_ms())
        if (ttl is not None and ttl <= 0) or self._fenced(entry):
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

    def holds_exact(self, key: str, model: str | None = None) -> bool:
        """Whether this node's memory (L1/L2) holds a live entry under `key` for `model`: an exact
        lookup will be answered, so the API need not embed the request's text for a semantic step
        that would not run."""
        meta = self._local_meta(key)
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
        meta = self._local_meta(key)
        if meta is None and self.l3 is not None:
            _, entry = await self._l3_call(self.l3.get, key, self.wall_ms())
            meta = None if entry is None else entry.meta
        return meta

    def _touch_local(self, key: str) -> None:
        """Count a use of `key` in the tier holding it (recency), without reading it."""
        if self.l2 is not None and self.l2.touch(key):
            return
        self.l1.touch(key)

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

    def _promote(self, step: Step, entry: Entry) -> None:
        """Copy a hit of `step` into the tiers the plan says it goes to."""
        self._admit(entry, to_l1="l1" in step.promote, to_l2="l2" in step.promote)

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
        return entry

    async def _remote_entries(self, wanted: Sequence[tuple[str, str | None]]) -> dict[str, RemoteHit]:
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

    async def _l3_call(
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
        except L3Rejected:
            # The data was refused, L3 itself answered: not a failure of L3, and not worth a retry.
            record((self.perf_ns() - started) / 1e6, ok=True)
            raise
        except Exception as exc:  # includes TimeoutError: L3 is slow or down; serve without it
            record((self.perf_ns() - started) / 1e6, ok=False)
            self.counters.l3_errors += 1
            log.warning("L3 call failed; serving from L1/L2", extra={"error": repr(exc)})
            return False, None
        record((self.perf_ns() - started) / 1e6, ok=True)
        return True, result

    # --- the lookup plan, executed ----------------------------------------------------------------

    def get_local(self, key: str, model: str | None = None) -> Lookup:
        """The local-only plan (L1 then L2, by exact key), synchronously; records the access."""
        started = self.perf_ns()
        walk = Walk((Query(key=key, model=model),), batched=False)
        if self.hearing:
            self._walk_in_process(walk, LOCAL_PLAN)
        return self._answers(walk, started)[0]

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
        """`get`'s in-process part, synchronously: the answer where this node's memory settles it (an exact
        or conclusive hit in L1/L2; a key alone held in L1 without a walk), else the walk for `finish`."""
        if key is None and embedding is None:
            raise ValueError("a lookup needs a key, an embedding, or both")
        started = self.perf_ns()
        if embedding is None and key is not None and self.hearing:
            held = self.l1.peek(key)
            if held is not None and (model is None or held.meta.model == model) and not self._fenced(held):
                self.l1.get(key)  # counts the hit and tells the policy, as the walk's probe does
                return self._finish(key, None, held, "l1", "exact", 1.0, started, False, trace_id)
        vec = None if embedding is None else np.asarray(embedding, dtype=np.float32)
        walk = Walk((Query(key, vec, model, tolerance, trace_id, text, screened),), batched=False)
        hearing = self._walk_local(walk)
        if walk.left or self._unsettled(walk):
            return Pending(walk, started, hearing)
        self._decide(walk)
        return self._answers(walk, started)[0]

    async def finish(self, pending: Pending) -> Lookup:
        """The rest of a lookup `begin` left open: the peers, L3, the decision."""
        await self._walk_remote(pending.walk, pending.hearing)
        return self._answers(pending.walk, pending.started_ns)[0]

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
        return got if isinstance(got, Lookup) else await self.finish(got)

    async def get_many(self, queries: Sequence[Query]) -> list[Lookup]:
        """Batched lookups along the same plan as `get`: one vectorised L1 probe for the exact keys, one
        for the embeddings (per model and tolerance), L2, the peers at once, one L3 query for the exact
        misses, then L3 searches for the rest."""
        started = self.perf_ns()
        walk = Walk(queries, batched=True)
        await self._walk(walk)
        return self._answers(walk, started)

    def _walk_in_process(self, walk: Walk, plan: Sequence[Step]) -> None:
        """The in-process steps of `plan` (its first ones), synchronously."""
        for step in plan:
            if not step.in_process or not walk.left:
                break
            if not (todo := walk.todo(step)):
                continue
            match step.source, step.match:
                case "l1", "exact":
                    self._l1_exact(step, walk, todo)
                case "l1", "semantic":
                    self._l1_semantic(step, walk, todo)
                case "l2", "exact":
                    self._l2_exact(step, walk, todo)
                case _:
                    raise AssertionError(f"no in-process probe for {step}")

    async def _walk(self, walk: Walk) -> None:
        """The whole plan: in-process steps, peers, L3 (L3 alone while the node hears no invalidations)."""
        await self._walk_remote(walk, self._walk_local(walk))

    def _walk_local(self, walk: Walk) -> bool:
        """The in-process steps where this node hears invalidations; returns whether it does."""
        hearing = self.hearing
        if hearing:
            self._walk_in_process(walk, PLAN)
        else:
            self.counters.unheard_lookups += len(walk.queries)
        return hearing

    async def _walk_remote(self, walk: Walk, hearing: bool) -> None:
        """The steps that leave the process (`hearing`: as `_walk_local` found it), then the decision."""
        for step in PLAN:
            if not walk.left:
                break
            if step.in_process or not (todo := walk.todo(step)):
                continue
            match step.source, step.match:
                case "peers", "exact":
                    if self.peers is not None and hearing and self.local_only:
                        self.counters.peers_skipped += len(todo)
                    elif self.peers is not None and hearing:
                        await self._peers_exact(step, walk, todo)
                case "l3", "exact":
                    if self.l3 is not None:
                        await self._l3_exact(step, walk, todo, self.l3)
                case "l3", "semantic":
                    if self.l3 is not None and self.l3.semantic:  # without pgvector: exact keys only
                        await self._l3_semantic(step, walk, todo, self.l3)
                case _:
                    raise AssertionError(f"no probe for {step}")
        await self._refine(walk)
        self._decide(walk)

    def _margin(self, q: Query) -> float:
        """How far below its floors a screened query's candidates are searched (refine.py)."""
        return self.refiner.band if q.screened and self.refiner is not None else 0.0

    def _offer(self, walk: Walk, i: int, step: Step, entry: Entry, similarity: float) -> None:
        """A semantic candidate for query `i`; a conclusive one (near-exact, served) ends its walk."""
        q = walk.queries[i]
        walk.offer(i, step, entry, similarity)
        if self.matcher.conclusive(q.text, entry.meta, similarity, q.tolerance, margin=self._margin(q)):
            walk.close(i)

    def _unsettled(self, walk: Walk) -> list[int]:
        """The screened queries whose verdict the cheap vector may get wrong (refine.py)."""
        out: list[int] = []
        if self.refiner is None:
            return out
        for i, offers in walk.offers.items():
            q = walk.queries[i]
            if walk.found[i] is not None or not (margin := self._margin(q)):
                continue
            thresholds = [self.matcher.threshold(o.entry.meta, q.tolerance) for o in offers]
            if unsettled([o.similarity for o in offers], thresholds, margin):
                out.append(i)
        return out

    async def _refine(self, walk: Walk) -> None:
        """Re-scores the unsettled screened queries' candidates with the precise model's vectors."""
        if self.refiner is None or not (todo := self._unsettled(walk)):
            return
        try:
            vectors = await self.refiner.precise([str(walk.queries[i].text) for i in todo])
        except Exception as exc:  # the model failed: the screened vectors decide, counted
            self.refiner.failed += len(todo)
            log.warning("precise re-score failed; screened verdicts stand", extra={"error": repr(exc)})
            return
        self.refiner.refined += len(todo)
        for i, vec in zip(todo, vectors, strict=True):
            offers = walk.offers[i]
            walk.offers[i] = rescore(offers, vec)
            self.refiner.observe(offers, walk.offers[i])

    def _decide(self, walk: Walk) -> None:
        """The best acceptable candidate across tiers for every query the exact steps left unanswered
        (matching/decision.py's `best_candidate`); it is promoted as its step says."""
        if self.refiner is not None:
            self.refiner.screened += sum(q.screened for q in walk.queries)
        for i, offers in walk.offers.items():
            if walk.found[i] is not None:
                continue  # an exact key beats every semantic candidate
            q = walk.queries[i]
            offers = list({o.entry.key: o for o in reversed(offers)}.values())  # a key once: its fastest tier
            cands = [self.matcher.candidate(o.entry.meta, o.similarity, o.step.tier) for o in offers]
            result = self.matcher.best(q.text, cands, key=q.key, tolerance=q.tolerance)
            if result.candidate is None:
                continue
            if not result.served and result.verdict != "explore":
                walk.refused[i] = result
            chosen = offers[next(j for j, c in enumerate(cands) if c is result.candidate)]
            if result.served:
                if chosen.step.source == "l1":
                    self.l1.note_semantic_hit(chosen.entry.key)
                else:
                    self._promote(chosen.step, chosen.entry)
                walk.hit(i, chosen.step, chosen.entry, chosen.similarity)
            elif result.verdict == "explore":
                walk.explore[i] = chosen

    def _l1_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        qs = walk.queries
        keys = [str(qs[i].key) for i in todo]
        # One query: the scalar probe (the fast path); a batch: one vectorised probe of the cuckoo table.
        values = self.l1.get_many(keys) if walk.batched else [self.l1.get(k) for k in keys]
        for i, cached in zip(todo, values, strict=True):
            model = qs[i].model
            if cached is not None and (model is None or cached.meta.model == model):
                walk.hit(i, step, cached, 1.0)

    def _l1_semantic(self, step: Step, walk: Walk, todo: list[int]) -> None:
        qs = walk.queries
        groups: dict[tuple[str | None, float | None, float], list[int]] = {}
        for i in todo:
            groups.setdefault((qs[i].model, qs[i].tolerance, self._margin(qs[i])), []).append(i)
        for (model, tolerance, margin), idx in groups.items():
            found = self.l1.semantic_candidates(
                np.stack([qs[i].embedding for i in idx]),  # type: ignore[misc]
                min_similarity=self.matcher.min_similarity(tolerance) - margin,
                entry_floor=self.matcher.entry_floors,
                floor_margin=margin,
                model=model,
            )
            for i, near in zip(idx, found, strict=True):
                for hit in near:
                    self._offer(walk, i, step, hit.value, hit.similarity)

    def _l2_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        for i in todo:
            q = walk.queries[i]
            entry = self._l2_entry(str(q.key), q.model)
            if entry is not None:
                self._promote(step, entry)
                walk.hit(i, step, entry, 1.0)

    async def _peers_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        wanted = [(str(walk.queries[i].key), walk.queries[i].model) for i in todo]
        remote = await self._remote_entries(wanted)
        for first in remote.values():  # once per key: a peer's copy is as good as L3's
            self._promote(step, first.entry)
        for i, (key, model) in zip(todo, wanted, strict=True):
            got = remote.get(key)
            # A batch may ask one key for two models: the hit was checked against the first only.
            if got is not None and (model is None or got.entry.meta.model == model):
                walk.hit(i, step, got.entry, 1.0, peer=got.peer)

    async def _l3_exact(self, step: Step, walk: Walk, todo: list[int], l3: L3Store) -> None:
        qs = walk.queries
        now = self.wall_ms()
        if walk.batched:
            ran, rows = await self._l3_call(l3.get_many, list({qs[i].key for i in todo}), now)
        else:
            (i,) = todo
            q = qs[i]
            if step.fused_with_next and q.embedding is not None and l3.semantic:
                ran, found = await self._l3_call(
                    l3.find_neighbours,
                    q.key,
                    q.embedding,
                    now,
                    model=q.model,
                    min_similarity=self.matcher.min_similarity(q.tolerance) - self._margin(q),
                    candidates=self.l3_candidates,
                )
                walk.asked(i, step, ran)
                walk.close(i)  # both L3 legs were asked
                if found is not None:
                    exact, near = found
                    if exact is not None:
                        self._promote(step, exact)
                        walk.hit(i, step, exact, 1.0)
                    semantic = PLAN[PLAN.index(step) + 1]
                    for match in near:
                        walk.offer(i, semantic, match.entry, match.similarity)
                return
            ran, row = await self._l3_call(l3.get, q.key, now)
            rows = {q.key: row} if row is not None else None
        for i in todo:
            q = qs[i]
            entry = (rows or {}).get(q.key)
            walk.asked(i, step, ran)
            if entry is not None and (q.model is None or entry.meta.model == q.model):
                self._promote(step, entry)
                walk.hit(i, step, entry, 1.0)

    async def _l3_semantic(self, step: Step, walk: Walk, todo: list[int], l3: L3Store) -> None:
        results = []
        for i in todo:  # sequential: the pool is shared with request paths, and the breaker counts each
            q = walk.queries[i]
            results.append(
                await self._l3_call(
                    l3.neighbours,
                    q.embedding,
                    self.wall_ms(),
                    model=q.model,
                    min_similarity=self.matcher.min_similarity(q.tolerance) - self._margin(q),
                    candidates=self.l3_candidates,
                )
            )
        for i, (ran, near) in zip(todo, results, strict=True):
            walk.asked(i, step, ran)
            for match in near or ():
                self._offer(walk, i, step, match.entry, match.similarity)

    def _answers(self, walk: Walk, started_ns: int) -> list[Lookup]:
        out = []
        for i, q in enumerate(walk.queries):
            f = walk.found[i]
            if f is not None and self._fenced(f.entry):
                self.counters.fenced += 1
                f = None  # older than a write heard of: a miss, never a stale answer
            out.append(
                self._finish(
                    q.key,
                    q.embedding,
                    None if f is None else f.entry,
                    None if f is None else f.tier,
                    None if f is None else f.match,
                    None if f is None else f.similarity,
                    started_ns,
                    walk.degraded[i],
                    q.trace_id,
                    None if f is None else f.peer,
                    walk.explore.get(i),
                    None if f is not None or q.embedding is None else walk.refused.get(i, _NO_CANDIDATE),
                )
            )
        return out

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
        explore: Offer | None = None,
        refused: MatchResult | None = None,
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
            if explore is not None:
                return Lookup(
                    None,
                    similarity=explore.similarity,
                    latency_us=latency_us,
                    degraded=degraded,
                    explore_key=explore.entry.key,
                    explore_entry=explore.entry,
                    miss_rule="uncertain",
                    miss_reason="explored: ask the model and report whether it agrees",
                )
            if refused is not None:
                return Lookup(
                    None,
                    similarity=refused.similarity if refused.candidate is not None else None,
                    latency_us=latency_us,
                    degraded=degraded,
                    miss_rule=refused.rule,
                    miss_reason=refused.reason,
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
