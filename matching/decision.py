"""Whether a cached candidate answers a request: the one decision lookups and semantic invalidation share.

Order: the exact key (or the same normalised text) serves; otherwise the guards (matching/guards.py)
veto near-miss traps; otherwise the entry's learned threshold (matching/threshold.py) decides serve,
explore or miss. How the request's and the entry's floors combine with it, texts that are unknown and δ
per model: docs/tiers.md ("The match decision").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from matching import guards
from matching.deltas import DeltaTable
from matching.threshold import EntryThreshold, ThresholdLearner

# Cosine at which two prompts count as the same text for best_candidate's early stop (not for serving).
NEAR_EXACT = 0.995


class Verdict(StrEnum):
    SERVE = "serve"
    MISS = "miss"
    EXPLORE = "explore"  # answer from the model and report whether it agrees with the candidate's


@dataclass(frozen=True, slots=True)
class Candidate:
    """A cached entry found for a request, from any tier (`tier` 0 is the fastest)."""

    key: str
    text: str
    similarity: float
    tier: int = 0
    similarity_tolerance: float | None = None
    state: EntryThreshold | None = None
    group: str = ""  # whose δ and pooled learner apply (the entry's model); "" the default one


@dataclass(frozen=True, slots=True)
class MatchResult:
    verdict: Verdict
    similarity: float
    threshold: float  # the similarity this candidate needed to be served (inf: only by key)
    reason: str
    candidate: Candidate | None = None
    guard: str | None = None  # the guard that vetoed it, if one did
    exact: bool = False

    @property
    def served(self) -> bool:
        return self.verdict is Verdict.SERVE

    @property
    def rule(self) -> str:
        """Which rule decided, in a word: "exact", "threshold" (served, or refused below it), "floor"
        (below the request's or entry's cosine floor), "guard:<name>", "uncertain" (explored below the
        threshold), "verify" (a would-be hit asked of the model to label it), or "no candidate"."""
        if self.exact:
            return "exact"
        if self.guard is not None:
            return f"guard:{self.guard}"
        if self.candidate is None:
            return "no candidate"
        if self.verdict is Verdict.EXPLORE:
            return "verify" if self.similarity >= self.threshold else "uncertain"
        return "floor" if " < floor " in self.reason else "threshold"

    @property
    def conclusive(self) -> bool:
        """No other tier can do better: stop walking tiers."""
        return self.served and (self.exact or self.similarity >= NEAR_EXACT)


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def same_text(a: str, b: str) -> bool:
    """Two known prompts that are one text (spacing and case aside): served as exact, not by similarity."""
    return bool(a) and bool(b) and _normalised(a) == _normalised(b)


def floor(tolerance: float | None, similarity_tolerance: float | None) -> float | None:
    """The stricter of the request's and the entry's cosine floors, or None when neither is set."""
    set_ = [t for t in (tolerance, similarity_tolerance) if t is not None]
    for t in set_:
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"tolerance must be in [0, 1], got {t}")
    return max(set_) if set_ else None


@dataclass
class MatchDecision:
    """Decides serve / miss / explore for candidates; feed labels back through `feedback`.

    `draw` supplies uniform [0, 1) numbers for exploration (pass `random.Random(seed).random`)."""

    learner: ThresholdLearner
    draw: Callable[[], float]
    use_guards: bool = True
    guard_set: dict[str, guards.Guard] = field(default_factory=lambda: dict(guards.GUARDS))
    deltas: DeltaTable | None = None
    learners: dict[str, ThresholdLearner] = field(default_factory=dict)  # per group, made on first use

    def learner_for(self, group: str) -> ThresholdLearner:
        """The learner of `group`: `learner` itself unless `deltas` gives the group another δ."""
        if self.deltas is None or not group:
            return self.learner
        delta = self.deltas.delta_for(group, self.learner.delta)
        if delta == self.learner.delta and group not in self.deltas.by_group:
            return self.learner
        if group not in self.learners:
            self.learners[group] = self.learner.fresh(delta)
        return self.learners[group]

    def decide(
        self,
        request_text: str,
        candidate: Candidate,
        *,
        request_key: str | None = None,
        tolerance: float | None = None,
    ) -> MatchResult:
        s = float(candidate.similarity)
        if request_key is not None and request_key == candidate.key:
            return MatchResult(Verdict.SERVE, s, -1.0, "exact key", candidate, exact=True)
        known = bool(request_text) and bool(candidate.text)
        if same_text(request_text, candidate.text):
            return MatchResult(Verdict.SERVE, s, -1.0, "same text", candidate, exact=True)
        if self.use_guards and known:
            hit = guards.check(candidate.text, request_text, self.guard_set)
            if hit is not None:
                return MatchResult(Verdict.MISS, s, float("inf"), hit.reason, candidate, guard=hit.guard)
        low = floor(tolerance, candidate.similarity_tolerance)
        assessment = self.learner_for(candidate.group).assess(candidate.state, s, self.draw())
        threshold = max(assessment.threshold, low) if low is not None else assessment.threshold
        if low is not None and s < low:
            return MatchResult(Verdict.MISS, s, threshold, f"similarity {s:.3f} < floor {low:.3f}", candidate)
        return MatchResult(Verdict(assessment.action), s, threshold, assessment.reason, candidate)

    def best_candidate(
        self,
        request_text: str,
        candidates: Sequence[Candidate],
        *,
        request_key: str | None = None,
        tolerance: float | None = None,
    ) -> MatchResult:
        """The best acceptable candidate among several tiers' (a miss when none is).

        Served ones rank by exact match, then similarity, then the faster tier, so an exact or near-exact
        entry in a slow tier beats a weaker one in a fast tier; the learner's verify_rate of those served by
        similarity are explored instead (verified). Without a served one, the most similar explored
        candidate is returned (at most one exploration per request), else the closest miss."""
        results = [
            self.decide(request_text, c, request_key=request_key, tolerance=tolerance) for c in candidates
        ]
        served = [r for r in results if r.served]
        if served:
            best = max(served, key=lambda r: (r.exact, r.similarity, -_tier(r)))
            if not best.exact and best.candidate is not None:
                learner = self.learner_for(best.candidate.group)
                if learner.verifies(self.draw()):
                    reason = (
                        f"verifying: {best.similarity:.3f} >= threshold {best.threshold:.3f}, one of the "
                    )
                    reason += f"{learner.verify_rate:.0%} of would-be hits asked of the model for a label"
                    return replace(best, verdict=Verdict.EXPLORE, reason=reason)
                learner.note_served()
            return best
        explored = [r for r in results if r.verdict is Verdict.EXPLORE]
        if explored:
            return max(explored, key=lambda r: r.similarity)
        if results:
            return max(results, key=lambda r: r.similarity)
        return MatchResult(Verdict.MISS, 0.0, float("inf"), "no candidate")

    def feedback(self, candidate: Candidate, correct: bool, *, explored: bool = False) -> None:
        """A label for a served candidate (the user/gateway verdict) or an explored one (`explored`: whether
        the model's answer agreed). Label only what was served or explored: the bound assumes so."""
        if candidate.state is None:
            raise ValueError("feedback needs the candidate's EntryThreshold state")
        learner = self.learner_for(candidate.group)
        learner.observe(candidate.state, candidate.similarity, correct, explored=explored)


def _tier(result: MatchResult) -> int:
    return result.candidate.tier if result.candidate is not None else 0
