"""The lookup plan: the one order in which `get`, `get_many` and `get_local` walk the tiers, and what each
step may do (docs/design.md §1-§3); plus a lookup's query, its answer and the walk's bookkeeping.

L1 exact, L1 semantic, L2 exact (L2 is exact-key only), other nodes' L2 exact, L3 exact, L3 semantic:
tier by tier, the exact key before the embedding in each. An exact key ends the walk; a semantic
candidate is only offered (`Walk.offer`), and the walk goes on unless it is conclusive (near-exact),
so the best acceptable candidate across tiers is served (services/tiers/node/matcher.py decides).
The in-process steps come first and are all a local-only lookup (`get_local`) may use. A hit below L1
is copied into the tiers above it (`promote`); a peer's hit is tier "l2" with `remote` set; a step
behind the L3 breaker that is refused or fails marks the lookups it was asked for `degraded` (served
from L1/L2 only). Executed by `LookupExecutor` (executor.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from matching.decision import MatchResult
from schemas.events import Tier
from services.tiers.entry import Entry

Match = Literal["exact", "semantic"]
Source = Literal["l1", "l2", "peers", "l3"]


@dataclass(frozen=True, slots=True)
class Query:
    """One lookup: an exact key, an embedding, or both (exact first)."""

    key: str | None = None
    embedding: np.ndarray | None = None
    model: str | None = None
    tolerance: float | None = None
    trace_id: str | None = None
    # The request's text, when the lookup came by text: the match guards compare it with the prompts.
    text: str | None = None
    # `embedding` is the cheap model's (refine.py): candidates near their threshold are re-scored.
    screened: bool = False


class Lookup(NamedTuple):  # a tuple: one is built per lookup (0.26 us; a frozen dataclass 0.91)
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
    # A miss the learned decision wants explored: ask the model and report whether its answer agrees
    # with this entry's (POST /v1/feedback with explored true). `similarity` is the candidate's.
    explore_key: str | None = None
    # Why a semantic lookup missed: the rule that refused its best candidate (matching/decision.py
    # `MatchResult.rule`, "no candidate" when none came near) and in words; `similarity` is that
    # candidate's. None for a hit or a lookup by key alone.
    miss_rule: str | None = None
    miss_reason: str | None = None
    # The entry to explore (`explore_key`'s): its value goes out with the miss, so the caller compares
    # answers without a second read (which would count as a hit).
    explore_entry: Entry | None = None

    @property
    def hit(self) -> bool:
        return self.entry is not None


@dataclass(frozen=True, slots=True)
class Step:
    source: Source  # where it looks: this node's L1 or L2, the peers' L2 pools, L3
    match: Match  # "exact" needs the query's key, "semantic" its embedding
    tier: Tier  # what a hit reports
    in_process: bool  # answered from this process's memory, synchronously: open to `get_local`
    promote: tuple[Tier, ...]  # where a hit here is copied on this node
    guarded: bool = False  # behind the L3 breaker: refused, failed or timed out -> degraded
    # A single lookup holding what this step and the next need asks both in one call (L3's
    # `find_neighbours`: one round trip where the store can search); a batch asks them one after the
    # other.
    fused_with_next: bool = False


PLAN: tuple[Step, ...] = (
    Step("l1", "exact", "l1", in_process=True, promote=()),
    Step("l1", "semantic", "l1", in_process=True, promote=()),
    Step("l2", "exact", "l2", in_process=True, promote=("l1",)),
    Step("peers", "exact", "l2", in_process=False, promote=("l1", "l2")),
    Step("l3", "exact", "l3", in_process=False, promote=("l1", "l2"), guarded=True, fused_with_next=True),
    Step("l3", "semantic", "l3", in_process=False, promote=("l1", "l2"), guarded=True),
)
# What a local-only lookup may use: the in-process prefix of the plan.
LOCAL_PLAN: tuple[Step, ...] = tuple(s for s in PLAN if s.in_process)
if PLAN[: len(LOCAL_PLAN)] != LOCAL_PLAN:
    raise AssertionError("the in-process steps must come before any step that leaves the process")


class Found(NamedTuple):  # a tuple: built on the in-process fast path
    entry: Entry
    tier: Tier
    match: Match
    similarity: float
    peer: str | None = None  # a peer's block server (host:port) when the hit is remote


class Offer(NamedTuple):
    """A semantic candidate a step found; the match decision picks among a query's offers."""

    entry: Entry
    similarity: float
    step: Step


class Pending(NamedTuple):
    """A lookup `TieredCache.begin` could not settle in process: its walk, when it started, and whether
    the node heard invalidations then (the walk goes on as it began)."""

    walk: Walk
    started_ns: int
    hearing: bool


class Walk:
    """One lookup (`batched` False) or a batch walking the plan: which queries are still open, what was
    found, which were degraded."""

    __slots__ = ("_open", "batched", "degraded", "explore", "found", "left", "offers", "queries", "refused")

    def __init__(self, queries: Sequence[Query], *, batched: bool) -> None:
        self.queries = queries
        self.batched = batched
        n = len(queries)
        self.found: list[Found | None] = [None] * n
        self.degraded = [False] * n
        # False once answered, or once every step that could answer it was asked (a fused call).
        self._open = [True] * n
        self.left = n  # how many are still open: at 0 the walk stops
        self.offers: dict[int, list[Offer]] = {}  # semantic candidates, decided when the walk ends
        self.explore: dict[int, Offer] = {}  # the candidate to explore, for a miss the decision explores
        self.refused: dict[int, MatchResult] = {}  # why the decision served none of a query's candidates

    def todo(self, step: Step) -> list[int]:
        """The queries `step` may still answer: open, and holding what it needs (key or embedding)."""
        qs, exact = self.queries, step.match == "exact"
        return [
            i
            for i, is_open in enumerate(self._open)
            if is_open and (qs[i].key if exact else qs[i].embedding) is not None
        ]

    def hit(
        self,
        i: int,
        step: Step,
        entry: Entry,
        similarity: float,
        *,
        match: Match | None = None,
        peer: str | None = None,
    ) -> None:
        self.found[i] = Found(entry, step.tier, match or step.match, similarity, peer)
        if self._open[i]:
            self._open[i] = False
            self.left -= 1

    def offer(self, i: int, step: Step, entry: Entry, similarity: float) -> None:
        self.offers.setdefault(i, []).append(Offer(entry, similarity, step))

    def asked(self, i: int, step: Step, ran: bool) -> None:
        """`step` was asked for query `i`; a guarded step that did not run degrades the answer."""
        if step.guarded and not ran:
            self.degraded[i] = True

    def close(self, i: int) -> None:
        if self._open[i]:
            self._open[i] = False
            self.left -= 1
