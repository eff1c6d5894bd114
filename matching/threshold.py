"""A similarity threshold learned from feedback, bounding by δ the error rate of what is served.

Reference: "vCache: Verified Semantic Prompt Caching" (2025) for the shape (a per-entry threshold learned
online from labels under a user-set δ, exploring when unsure); the pooled part bounds the served error
directly, as in distribution-free risk control ("Learn then Test", Angelopoulos et al. 2021).
Parameters (defaults): δ 0.02 (vCache's default), z_conf 1.645 (one-sided 95%), explore_rate 0.3,
explore_floor 0.7, cold_threshold None, min_labels 20, grid step 0.005, 32 labels kept per entry,
4,096 in the pool. Pure: the caller passes the random draw and persists `to_dict()`.
How it decides, in full: docs/tiers.md ("How the learned threshold decides").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from matching import calibration

PooledModel = Literal["tail", "sigmoid", "sigmoid-point"]
POOLED_MODELS: tuple[PooledModel, ...] = ("tail", "sigmoid", "sigmoid-point")


def wilson_upper(rate: np.ndarray, n: np.ndarray, z: float) -> np.ndarray:
    """One-sided Wilson upper bounds on rates observed over `n` (effective) samples; 1 where n = 0."""
    rate, n = np.clip(np.asarray(rate, dtype=np.float64), 0.0, 1.0), np.asarray(n, dtype=np.float64)
    safe = np.where(n > 0, n, 1.0)
    z2 = z * z
    centre = rate + z2 / (2 * safe)
    spread = z * np.sqrt(rate * (1 - rate) / safe + z2 / (4 * safe * safe))
    return np.where(n > 0, np.minimum(1.0, (centre + spread) / (1 + z2 / safe)), 1.0)


@dataclass(slots=True)
class EntryThreshold:
    """One cached entry's own feedback (persist `to_dict()` with the entry)."""

    sims: list[float] = field(default_factory=list)
    labels: list[bool] = field(default_factory=list)

    @property
    def labelled(self) -> int:
        return len(self.sims)

    def strictest_wrong(self) -> float | None:
        """The highest similarity at which this entry was a wrong answer, or None."""
        wrong = [s for s, c in zip(self.sims, self.labels, strict=True) if not c]
        return max(wrong) if wrong else None

    def to_dict(self) -> dict[str, Any]:
        return {"sims": [round(s, 6) for s in self.sims], "labels": [int(c) for c in self.labels]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EntryThreshold:
        sims, labels = list(map(float, data.get("sims", []))), [bool(c) for c in data.get("labels", [])]
        if len(sims) != len(labels):
            raise ValueError("sims and labels differ in length")
        return cls(sims, labels)


Action = Literal["serve", "explore", "miss"]


@dataclass(frozen=True, slots=True)
class Assessment:
    """What the threshold says about one candidate at similarity `similarity`."""

    action: Action
    similarity: float
    threshold: float  # serve at or above this similarity (inf: never by similarity alone)
    explore_from: float  # explore (with probability) at or above this, below `threshold`
    error_bound: float | None  # pooled upper bound on the error served from `threshold`; None if none
    cold: bool
    reason: str


@dataclass
class ThresholdLearner:
    """The pooled bound plus the per-entry rule; one per model (or namespace) with its own δ."""

    delta: float = 0.02
    z_conf: float = 1.645
    explore_rate: float = 0.3
    # The share of would-be semantic hits asked of the model instead (verified: labels above the
    # threshold that need no human rating); 0 verifies none.
    verify_rate: float = 0.0
    cold_threshold: float | None = None  # None: a cold pool serves nothing by similarity alone
    explore_floor: float = 0.7
    min_labels: int = 20
    grid_step: float = 0.005
    max_entry_labels: int = 32
    max_pool_labels: int = 4096
    # How the pool certifies a threshold: "tail" (the count bound above), "sigmoid" (matching/
    # calibration.py: a pooled sigmoid's bound on the served error), "sigmoid-point" (its bound on
    # P(wrong) at the threshold itself, vCache's rule).
    model: PooledModel = "tail"
    pool_sims: list[float] = field(default_factory=list)
    pool_labels: list[bool] = field(default_factory=list)
    pool_explored: list[bool] = field(default_factory=list)
    pool_verified: list[bool] = field(default_factory=list)  # of the explored: would-be hits verified
    served: int = 0  # answers served by similarity (not by key), the denominator of the rating rate
    rated: int = 0  # of those, how many were rated
    _fit: tuple[float, float | None] | None = field(default=None, repr=False)
    _stale: int = field(default=0, repr=False)  # labels observed since `_fit`

    def __post_init__(self) -> None:
        if not 0.0 < self.delta < 0.5:
            raise ValueError(f"delta must be in (0, 0.5), got {self.delta}")
        if not 0.0 < self.explore_rate <= 1.0:
            raise ValueError(f"explore_rate must be in (0, 1], got {self.explore_rate}")
        if not 0.0 <= self.verify_rate < 1.0:
            raise ValueError(f"verify_rate must be in [0, 1), got {self.verify_rate}")
        if self.model not in POOLED_MODELS:
            raise ValueError(f"model must be one of {POOLED_MODELS}, got {self.model!r}")

    # -- feedback ---------------------------------------------------------------------------------------

    def note_served(self) -> None:
        """An answer was served by similarity: counts towards the rate at which served answers are rated."""
        self.served += 1

    def observe(
        self, entry: EntryThreshold, similarity: float, correct: bool, explored: bool = False
    ) -> None:
        """A label for a candidate at `similarity` of `entry`: a rating of a served answer, or (`explored`)
        whether the model's answer agreed with the candidate's: below the entry's threshold an
        exploration, at or above it a verified would-be hit."""
        verified = explored and similarity >= self.thresholds(entry)[0]
        entry.sims.append(float(similarity))
        entry.labels.append(bool(correct))
        del entry.sims[: -self.max_entry_labels], entry.labels[: -self.max_entry_labels]
        self.pool_sims.append(float(similarity))
        self.pool_labels.append(bool(correct))
        self.pool_explored.append(bool(explored))
        self.pool_verified.append(verified)
        n = self.max_pool_labels
        del self.pool_sims[:-n], self.pool_labels[:-n], self.pool_explored[:-n], self.pool_verified[:-n]
        if not explored:
            self.rated += 1
            self.served = max(self.served, self.rated)  # ratings of answers served before a restore
        # Refit after every label while the pool is small, then after each 1/64th of it: one label
        # barely moves a bound over thousands, and a refit costs O(pool).
        self._stale += 1
        if self._stale > len(self.pool_sims) // 64 or self.cold or self._fit == (self._cold_from, None):
            self._fit = None

    @property
    def _cold_from(self) -> float:
        return math.inf if self.cold_threshold is None else self.cold_threshold

    @property
    def cold(self) -> bool:
        return len(self.pool_sims) < self.min_labels

    def weighted_pool(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(similarities ascending, wrong, Horvitz-Thompson weight) of the pool's labels."""
        sims = np.asarray(self.pool_sims, dtype=np.float64)
        wrong = ~np.asarray(self.pool_labels, dtype=bool)
        explored = np.asarray(self.pool_explored, dtype=bool)
        verified = np.asarray(self.pool_verified, dtype=bool)
        # Rated answers are a served/rated sample of what was served, explorations a 1/explore_rate one
        # of the misses; verified would-be hits are every hit not served (weight 1: exact beside the
        # ratings, and without any ratings it weighs the region above the threshold down, not up).
        w = np.where(explored, 1.0 / self.explore_rate, self.served / max(self.rated, 1))
        w = np.where(verified, 1.0, w)
        order = np.argsort(sims, kind="stable")
        return sims[order], wrong[order], w[order]

    def bound_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(grid t ascending, upper bound on the error rate served from t), by `model`."""
        grid = np.arange(self.explore_floor, 1.0, self.grid_step)
        if not self.pool_sims:
            return grid, np.ones_like(grid)
        sims, wrong, w = self.weighted_pool()
        # Suffix sums: labels with similarity >= t start at searchsorted(sims, t).
        suffix = lambda x: np.concatenate([np.cumsum(x[::-1])[::-1], [0.0]])  # noqa: E731
        total, errors, squares = suffix(w), suffix(w * wrong), suffix(w * w)
        at = np.searchsorted(sims, grid, side="left")
        n_eff = np.divide(total[at] ** 2, squares[at], out=np.zeros(len(grid)), where=squares[at] > 0)
        rate = np.divide(errors[at], total[at], out=np.zeros(len(grid)), where=total[at] > 0)
        if self.model == "tail":
            return grid, wilson_upper(rate, n_eff, self.z_conf)
        # A model may interpolate, not invent: above t there must be at least as many (effective) labels
        # as could show an error rate <= δ with none wrong, z² (1 - δ) / δ (268 at 1%, 133 at 2%, 51 at
        # 5%), whatever the sigmoid says.
        thin = n_eff < self.z_conf**2 * (1 - self.delta) / self.delta
        theta, cov = calibration.fit_logistic(sims, ~wrong, w)
        if theta[1] <= 0:  # correctness does not rise with similarity here: nothing to certify
            return grid, np.ones_like(grid)
        if self.model == "sigmoid-point":
            bound = calibration.point_error_bound(grid, theta, cov, self.z_conf)
        else:
            bound = calibration.served_error_bound(grid, sims, w, theta, cov, self.z_conf)[1]
        # A sigmoid says errors vanish as s -> 1; where the labels above t already err more often than
        # the bound (wrong answers even between near-identical prompts), the observed rate stands.
        return grid, np.where(thin, 1.0, np.maximum(bound, rate))

    def pooled_threshold(self) -> tuple[float, float | None]:
        """(serve from, its error bound) for an entry without labels; (inf, None) if no t clears δ."""
        if self._fit is None:
            self._stale = 0
            if self.cold:
                self._fit = (self._cold_from, None)
            else:
                grid, bounds = self.bound_curve()
                ok = np.flatnonzero(bounds <= self.delta)
                self._fit = (float(grid[ok[0]]), float(bounds[ok[0]])) if len(ok) else (math.inf, None)
        return self._fit

    # -- decision ---------------------------------------------------------------------------------------

    def verifies(self, draw: float) -> bool:
        """Whether a would-be semantic hit is asked of the model instead, to be labelled (`draw` uniform)."""
        return not self.cold and draw < self.verify_rate

    def thresholds(self, entry: EntryThreshold | None) -> tuple[float, float]:
        """(serve from, explore from) similarities for this entry under δ."""
        serve, _ = self.pooled_threshold()
        wrong_at = entry.strictest_wrong() if entry is not None else None
        if wrong_at is not None:
            # This entry answered wrongly at `wrong_at`: whatever the pool says, not there or below.
            serve = max(serve, math.nextafter(wrong_at, math.inf))
        return serve, min(self.explore_floor, serve)

    def assess(self, entry: EntryThreshold | None, similarity: float, draw: float) -> Assessment:
        """Serve, explore or miss a candidate; `draw` is a uniform [0, 1) number from the caller's RNG."""
        serve_from, explore_from = self.thresholds(entry)
        cold = self.cold
        _, bound = self.pooled_threshold()
        if cold:
            tag = f"cold: {len(self.pool_sims)} of {self.min_labels} labels"
        elif bound is None:
            tag = f"no similarity certified at δ {self.delta}"
        else:
            tag = f"error bound {bound:.3f} <= δ {self.delta}"
        if similarity >= serve_from:
            action: Action = "serve"
            reason = f"similarity {similarity:.3f} >= threshold {serve_from:.3f} ({tag})"
        elif similarity >= explore_from and draw < self.explore_rate:
            action = "explore"
            reason = f"uncertain: {similarity:.3f} in [{explore_from:.3f}, {serve_from:.3f}) ({tag})"
        else:
            action = "miss"
            reason = f"similarity {similarity:.3f} < threshold {serve_from:.3f} ({tag})"
        return Assessment(action, similarity, serve_from, explore_from, bound, cold, reason)

    def fresh(self, delta: float) -> ThresholdLearner:
        """A learner with this one's options at another δ, and an empty pool."""
        options = {
            k: getattr(self, k)
            for k in (
                "z_conf",
                "explore_rate",
                "verify_rate",
                "cold_threshold",
                "explore_floor",
                "min_labels",
                "grid_step",
            )
        }
        return ThresholdLearner(
            delta=delta,
            max_entry_labels=self.max_entry_labels,
            max_pool_labels=self.max_pool_labels,
            model=self.model,
            **options,
        )

    # -- persistence ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "model": self.model,
            "pool_sims": [round(s, 6) for s in self.pool_sims],
            "pool_labels": [int(c) for c in self.pool_labels],
            "pool_explored": [int(e) for e in self.pool_explored],
            "pool_verified": [int(v) for v in self.pool_verified],
            "served": self.served,
            "rated": self.rated,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], **options: Any) -> ThresholdLearner:
        options.setdefault("model", data.get("model", "tail"))
        learner = cls(delta=float(data["delta"]), **options)
        learner.pool_sims = list(map(float, data.get("pool_sims", [])))
        learner.pool_labels = [bool(c) for c in data.get("pool_labels", [])]
        learner.pool_explored = [bool(e) for e in data.get("pool_explored", [False] * len(learner.pool_sims))]
        learner.pool_verified = [bool(v) for v in data.get("pool_verified", [False] * len(learner.pool_sims))]
        sizes = {len(learner.pool_sims), len(learner.pool_labels), len(learner.pool_explored)}
        if len(sizes | {len(learner.pool_verified)}) != 1:
            raise ValueError("pool lists differ in length")
        learner.rated = int(data.get("rated", sum(not e for e in learner.pool_explored)))
        learner.served = max(int(data.get("served", learner.rated)), learner.rated)
        return learner
