"""The executor of the lookup plan (plan.py) behind `get`, `get_many` and `get_local`: it walks the
steps over the node's tiers (`Placement`, placement.py), collects exact hits and semantic candidates,
and leaves the choice among candidates to the matcher, the only part that decides."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from matching.decision import MatchResult, Verdict
from schemas.events import Tier
from services.tiers.entry import Entry
from services.tiers.node.outbox import AccessRecord
from services.tiers.node.plan import LOCAL_PLAN, PLAN, Lookup, Match, Offer, Pending, Query, Step, Walk
from services.tiers.node.refine import rescore, unsettled
from services.tiers.ports import L3Store

if TYPE_CHECKING:
    from services.tiers.node.placement import Placement

log = logging.getLogger(__name__)

# A semantic lookup that found nothing near enough to decide on.
_NO_CANDIDATE = MatchResult(Verdict.MISS, 0.0, float("inf"), "no cached entry came near enough to decide on")


def embedding_key(embedding: npt.ArrayLike) -> str:
    """A stable key for an embedding-only lookup (access events need one)."""
    raw = np.ascontiguousarray(embedding, dtype=np.float32).tobytes()
    return "emb:" + hashlib.blake2b(raw, digest_size=12).hexdigest()


class LookupExecutor:
    """Walks the lookup plan over one node's tiers; what it reads and counts belongs to the node."""

    def __init__(self, node: Placement) -> None:
        self.node = node

    def get_local(self, key: str, model: str | None = None) -> Lookup:
        """The local-only plan (L1 then L2, by exact key), synchronously; records the access."""
        started = self.node.perf_ns()
        walk = Walk((Query(key=key, model=model),), batched=False)
        if self.node.hearing:
            self._walk_in_process(walk, LOCAL_PLAN)
        return self._answers(walk, started)[0]

    def begin(self, q: Query) -> Lookup | Pending:
        """`get`'s in-process part, synchronously: the answer where this node's memory settles it (an exact
        or conclusive hit in L1/L2; a key alone held in L1 without a walk), else the walk for `finish`."""
        if q.key is None and q.embedding is None:
            raise ValueError("a lookup needs a key, an embedding, or both")
        started = self.node.perf_ns()
        if q.embedding is None and q.key is not None and self.node.hearing:
            held = self.node.l1.peek(q.key)
            fits = held is not None and (q.model is None or held.meta.model == q.model)
            if held is not None and fits and not self.node.fenced(held):
                self.node.l1.get(q.key)  # counts the hit and tells the policy, as the walk's probe does
                return self._finish(q.key, None, held, "l1", "exact", 1.0, started, False, q.trace_id)
        walk = Walk((q,), batched=False)
        hearing = self._walk_local(walk)
        if walk.left or self._unsettled(walk):
            return Pending(walk, started, hearing)
        self._decide(walk)
        return self._answers(walk, started)[0]

    async def finish(self, pending: Pending) -> Lookup:
        """The rest of a lookup `begin` left open: the peers, L3, the decision."""
        await self._walk_remote(pending.walk, pending.hearing)
        return self._answers(pending.walk, pending.started_ns)[0]

    async def get_many(self, queries: Sequence[Query]) -> list[Lookup]:
        """Batched lookups along the same plan as `get`: one vectorised L1 probe for the exact keys, one
        for the embeddings (per model and tolerance), L2, the peers at once, one L3 query for the exact
        misses, then L3 searches for the rest."""
        started = self.node.perf_ns()
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
        hearing = self.node.hearing
        if hearing:
            self._walk_in_process(walk, PLAN)
        else:
            self.node.counters.unheard_lookups += len(walk.queries)
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
                    if self.node.peers is not None and hearing and self.node.local_only:
                        self.node.counters.peers_skipped += len(todo)
                    elif self.node.peers is not None and hearing:
                        await self._peers_exact(step, walk, todo)
                case "l3", "exact":
                    if self.node.l3 is not None:
                        await self._l3_exact(step, walk, todo, self.node.l3)
                case "l3", "semantic":
                    # Without pgvector: exact keys only.
                    if self.node.l3 is not None and self.node.l3.semantic:
                        await self._l3_semantic(step, walk, todo, self.node.l3)
                case _:
                    raise AssertionError(f"no probe for {step}")
        await self._refine(walk)
        self._decide(walk)

    def _margin(self, q: Query) -> float:
        """How far below its floors a screened query's candidates are searched (refine.py)."""
        return self.node.refiner.band if q.screened and self.node.refiner is not None else 0.0

    def _offer(self, walk: Walk, i: int, step: Step, entry: Entry, similarity: float) -> None:
        """A semantic candidate for query `i`; a conclusive one (near-exact, served) ends its walk."""
        q = walk.queries[i]
        walk.offer(i, step, entry, similarity)
        if self.node.matcher.conclusive(q.text, entry.meta, similarity, q.tolerance, margin=self._margin(q)):
            walk.close(i)

    def _unsettled(self, walk: Walk) -> list[int]:
        """The screened queries whose verdict the cheap vector may get wrong (refine.py)."""
        out: list[int] = []
        if self.node.refiner is None:
            return out
        for i, offers in walk.offers.items():
            q = walk.queries[i]
            if walk.found[i] is not None or not (margin := self._margin(q)):
                continue
            thresholds = [self.node.matcher.threshold(o.entry.meta, q.tolerance) for o in offers]
            if unsettled([o.similarity for o in offers], thresholds, margin):
                out.append(i)
        return out

    async def _refine(self, walk: Walk) -> None:
        """Re-scores the unsettled screened queries' candidates with the precise model's vectors."""
        if self.node.refiner is None or not (todo := self._unsettled(walk)):
            return
        try:
            vectors = await self.node.refiner.precise([str(walk.queries[i].text) for i in todo])
        except Exception as exc:  # the model failed: the screened vectors decide, counted
            self.node.refiner.failed += len(todo)
            log.warning("precise re-score failed; screened verdicts stand", extra={"error": repr(exc)})
            return
        self.node.refiner.refined += len(todo)
        for i, vec in zip(todo, vectors, strict=True):
            offers = walk.offers[i]
            walk.offers[i] = rescore(offers, vec)
            self.node.refiner.observe(offers, walk.offers[i])

    def _decide(self, walk: Walk) -> None:
        """The best acceptable candidate across tiers for every query the exact steps left unanswered
        (matching/decision.py's `best_candidate`); it is promoted as its step says."""
        if self.node.refiner is not None:
            self.node.refiner.screened += sum(q.screened for q in walk.queries)
        for i, offers in walk.offers.items():
            if walk.found[i] is not None:
                continue  # an exact key beats every semantic candidate
            q = walk.queries[i]
            offers = list({o.entry.key: o for o in reversed(offers)}.values())  # a key once: its fastest tier
            cands = [self.node.matcher.candidate(o.entry.meta, o.similarity, o.step.tier) for o in offers]
            result = self.node.matcher.best(q.text, cands, key=q.key, tolerance=q.tolerance)
            if result.candidate is None:
                continue
            if not result.served:
                walk.refused[i] = result  # an exploration too: it says whether it verifies a hit
            chosen = offers[next(j for j, c in enumerate(cands) if c is result.candidate)]
            if result.served:
                if chosen.step.source == "l1":
                    self.node.l1.note_semantic_hit(chosen.entry.key)
                else:
                    self.node.promote(chosen.step, chosen.entry)
                walk.hit(i, chosen.step, chosen.entry, chosen.similarity)
            elif result.verdict == "explore":
                walk.explore[i] = chosen

    def _l1_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        qs = walk.queries
        keys = [str(qs[i].key) for i in todo]
        # One query: the scalar probe (the fast path); a batch: one vectorised probe of the cuckoo table.
        values = self.node.l1.get_many(keys) if walk.batched else [self.node.l1.get(k) for k in keys]
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
            found = self.node.l1.semantic_candidates(
                np.stack([qs[i].embedding for i in idx]),  # type: ignore[misc]
                min_similarity=self.node.matcher.min_similarity(tolerance) - margin,
                entry_floor=self.node.matcher.entry_floors,
                floor_margin=margin,
                model=model,
            )
            for i, near in zip(idx, found, strict=True):
                for hit in near:
                    self._offer(walk, i, step, hit.value, hit.similarity)

    def _l2_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        for i in todo:
            q = walk.queries[i]
            entry = self.node.l2_entry(str(q.key), q.model)
            if entry is not None:
                self.node.promote(step, entry)
                walk.hit(i, step, entry, 1.0)

    async def _peers_exact(self, step: Step, walk: Walk, todo: list[int]) -> None:
        wanted = [(str(walk.queries[i].key), walk.queries[i].model) for i in todo]
        remote = await self.node.remote_entries(wanted)
        for first in remote.values():  # once per key: a peer's copy is as good as L3's
            self.node.promote(step, first.entry)
        for i, (key, model) in zip(todo, wanted, strict=True):
            got = remote.get(key)
            # A batch may ask one key for two models: the hit was checked against the first only.
            if got is not None and (model is None or got.entry.meta.model == model):
                walk.hit(i, step, got.entry, 1.0, peer=got.peer)

    async def _l3_exact(self, step: Step, walk: Walk, todo: list[int], l3: L3Store) -> None:
        qs = walk.queries
        now = self.node.wall_ms()
        if walk.batched:
            ran, rows = await self.node.l3_call(l3.get_many, list({qs[i].key for i in todo}), now)
        else:
            (i,) = todo
            q = qs[i]
            if step.fused_with_next and q.embedding is not None and l3.semantic:
                ran, found = await self.node.l3_call(
                    l3.find_neighbours,
                    q.key,
                    q.embedding,
                    now,
                    model=q.model,
                    min_similarity=self.node.matcher.min_similarity(q.tolerance) - self._margin(q),
                    candidates=self.node.l3_candidates,
                )
                walk.asked(i, step, ran)
                walk.close(i)  # both L3 legs were asked
                if found is not None:
                    exact, near = found
                    if exact is not None:
                        self.node.promote(step, exact)
                        walk.hit(i, step, exact, 1.0)
                    semantic = PLAN[PLAN.index(step) + 1]
                    for match in near:
                        walk.offer(i, semantic, match.entry, match.similarity)
                return
            ran, row = await self.node.l3_call(l3.get, q.key, now)
            rows = {q.key: row} if row is not None else None
        for i in todo:
            q = qs[i]
            entry = (rows or {}).get(q.key)
            walk.asked(i, step, ran)
            if entry is not None and (q.model is None or entry.meta.model == q.model):
                self.node.promote(step, entry)
                walk.hit(i, step, entry, 1.0)

    async def _l3_semantic(self, step: Step, walk: Walk, todo: list[int], l3: L3Store) -> None:
        results = []
        for i in todo:  # sequential: the pool is shared with request paths, and the breaker counts each
            q = walk.queries[i]
            results.append(
                await self.node.l3_call(
                    l3.neighbours,
                    q.embedding,
                    self.node.wall_ms(),
                    model=q.model,
                    min_similarity=self.node.matcher.min_similarity(q.tolerance) - self._margin(q),
                    candidates=self.node.l3_candidates,
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
            if f is not None and self.node.fenced(f.entry):
                self.node.counters.fenced += 1
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
        latency_us = (self.node.perf_ns() - started_ns) / 1e3
        c = self.node.counters
        c.lookups += 1
        c.degraded_lookups += degraded
        if entry is None:
            c.misses += 1
            record_key = key if key is not None else embedding_key(embedding)  # type: ignore[arg-type]
            self.node.outbox.access(
                AccessRecord(record_key, False, latency_us / 1e3, self.node.wall_ms(), trace_id=trace_id)
            )
            if explore is not None:
                verify = refused is not None and refused.rule == "verify"
                return Lookup(
                    None,
                    similarity=explore.similarity,
                    latency_us=latency_us,
                    degraded=degraded,
                    explore_key=explore.entry.key,
                    explore_entry=explore.entry,
                    miss_rule="verify" if verify else "uncertain",
                    miss_reason=(refused.reason if verify and refused else "explored")
                    + ": ask the model and report whether it agrees",
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
        self.node.outbox.access(
            AccessRecord(
                meta.key,
                True,
                latency_us / 1e3,
                self.node.wall_ms(),
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
