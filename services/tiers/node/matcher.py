"""The node's match decision (matching/decision.py) over its entries: which semantic candidate a lookup
serves, the per-entry feedback it learns from, and whether a write makes a neighbour stale.

Default (`delta` None): a fixed cosine floor plus the guards; learned (`delta` set): the threshold of
matching/threshold.py at that δ. Semantic invalidation always uses the fixed rule: a write must never
leave more stale neighbours behind than the threshold allows. In full: docs/tiers.md ("The node's
matcher").
"""

from __future__ import annotations

import random
import sys
from collections import OrderedDict
from collections.abc import Sequence

from matching.decision import NEAR_EXACT, Candidate, MatchDecision, MatchResult, same_text
from matching.deltas import DeltaTable
from matching.threshold import EntryThreshold, ThresholdLearner
from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR
from services.tiers.entry import EntryMeta

_TIER_RANK = {"l1": 0, "l2": 1, "l3": 2}


def _fixed_decision() -> MatchDecision:
    # A learner that never warms (min_labels unreachable) and serves from 0: the floor decides. Its
    # draw is 1.0, never below explore_rate, so it never explores.
    learner = ThresholdLearner(cold_threshold=0.0, min_labels=sys.maxsize, explore_rate=1.0)
    return MatchDecision(learner, lambda: 1.0)


class Matcher:
    """One node's decision; `delta` None is the default fixed floor + guards."""

    def __init__(
        self,
        *,
        delta: float | None = None,
        default_similarity_tolerance: float = DEFAULT_SIMILARITY_FLOOR,
        seed: int = 0,
        max_states: int = 100_000,
        deltas: dict[str, float] | None = None,
        explore_rate: float = 1.0,
        verify_rate: float = 0.0,
    ) -> None:
        self.delta = delta
        self.default_similarity_tolerance = default_similarity_tolerance
        self.max_states = max_states
        if delta is None:
            self.decision = _fixed_decision()
        else:
            # The pooled sigmoid: the most paraphrase hits within δ in bench/semantic.py.
            learner = ThresholdLearner(
                delta=delta, model="sigmoid", explore_rate=explore_rate, verify_rate=verify_rate
            )
            table = DeltaTable(deltas or {})
            self.decision = MatchDecision(learner, random.Random(seed).random, deltas=table)
        self._invalidation = _fixed_decision()
        self._states: OrderedDict[str, EntryThreshold] = OrderedDict()

    @property
    def learned(self) -> bool:
        return self.delta is not None

    # --- what the tiers search for -----------------------------------------------------------------

    def min_similarity(self, tolerance: float | None) -> float:
        """The lowest cosine a tier need return as a candidate for a request with `tolerance`."""
        low = 0.0 if tolerance is None else tolerance
        return max(low, self.decision.learner.explore_floor) if self.learned else low

    @property
    def entry_floors(self) -> bool:
        """Whether a tier may drop candidates below the entry's own tolerance before the decision."""
        return not self.learned

    def own_floor(self, meta: EntryMeta) -> float | None:
        """The entry's own cosine floor: its tolerance, except under the learned decision where it is just
        the node's default (then it would cap the learned threshold at the old fixed one)."""
        if self.learned and abs(meta.similarity_tolerance - self.default_similarity_tolerance) < 1e-6:
            return None
        return meta.similarity_tolerance

    def candidate(self, meta: EntryMeta, similarity: float, tier: str) -> Candidate:
        return Candidate(
            meta.key,
            meta.prompt_text or "",
            float(similarity),
            _TIER_RANK.get(tier, 3),
            self.own_floor(meta),
            self._states.get(meta.key),
            meta.model,
        )

    # --- lookups -----------------------------------------------------------------------------------

    def conclusive(
        self,
        text: str | None,
        meta: EntryMeta,
        similarity: float,
        tolerance: float | None,
        *,
        margin: float = 0.0,
    ) -> bool:
        """A served candidate no other tier can beat (near-exact): the walk stops here. `margin`: how
        far `similarity` may be off (a screened lookup: it must be served `margin` lower too)."""
        if similarity < NEAR_EXACT:
            return False
        result = self.decision.decide(
            text or "", self.candidate(meta, similarity - margin, "l1"), tolerance=tolerance
        )
        return result.served if margin else result.conclusive

    def best(
        self,
        text: str | None,
        candidates: Sequence[Candidate],
        *,
        key: str | None = None,
        tolerance: float | None = None,
    ) -> MatchResult:
        return self.decision.best_candidate(text or "", candidates, request_key=key, tolerance=tolerance)

    # --- feedback ----------------------------------------------------------------------------------

    def teaches(self, meta: EntryMeta, text: str | None) -> bool:
        """Whether a label of `meta`'s entry for request `text` says anything about similarity: not when
        the request is the entry's own text (served as exact; its labels, all at ~1.0, would make the
        pool trust high similarities that the public paraphrase sets show are often wrong)."""
        return not (text and meta.prompt_text and same_text(text, meta.prompt_text))

    def feedback(
        self, meta: EntryMeta, similarity: float, correct: bool, *, explored: bool = False
    ) -> EntryThreshold:
        """Record whether `meta`'s entry was the right answer at `similarity`; returns its state."""
        state = self._states.get(meta.key)
        if state is None:
            state = self._states[meta.key] = EntryThreshold()
            while len(self._states) > self.max_states:
                self._states.popitem(last=False)
        self._states.move_to_end(meta.key)
        cand = Candidate(meta.key, meta.prompt_text or "", float(similarity), state=state, group=meta.model)
        self.decision.feedback(cand, correct, explored=explored)
        return state

    def labels(self, key: str) -> int:
        """How many labels this node holds for entry `key`."""
        state = self._states.get(key)
        return 0 if state is None else state.labelled

    def threshold(self, meta: EntryMeta, tolerance: float | None = None) -> float:
        """The similarity a candidate of this entry needs now (for reports)."""
        learner = self.decision.learner_for(meta.model)
        serve_from, _ = learner.thresholds(self._states.get(meta.key))
        floors = [t for t in (self.own_floor(meta), tolerance, serve_from) if t is not None]
        return max(floors)

    def write_threshold(self, meta: EntryMeta) -> float:
        """How similar a neighbour must be for a write of `meta` (no threshold asked) to make it stale:
        the entry's tolerance; under the learned decision, where the writer left it at the node's
        default, no lower than the similarity the node serves a neighbour from for that model, so a
        write drops only what the node would have served in its place (near-exact repeats only while
        nothing is certified). A miss filled by a write was judged another question; dropping its
        neighbours would lose their answers."""
        own = self.own_floor(meta)
        if own is not None:
            return own
        serve_from, _ = self.decision.learner_for(meta.model).thresholds(None)
        return max(meta.similarity_tolerance, min(serve_from, NEAR_EXACT))

    def forget(self, key: str) -> None:
        """The entry was rewritten or dropped: its labels were about another answer."""
        self._states.pop(key, None)

    # --- semantic invalidation ---------------------------------------------------------------------

    def same_question(
        self, written: str | None, neighbour: EntryMeta, similarity: float, threshold: float
    ) -> bool:
        """Whether a write of prompt `written` makes `neighbour` (at `similarity`) stale: at or above
        `threshold`, and no guard fires when both prompts are known."""
        cand = Candidate(neighbour.key, neighbour.prompt_text or "", float(similarity), 0, threshold)
        return self._invalidation.decide(written or "", cand).served
