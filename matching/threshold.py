"""A similarity threshold learned per cached entry from feedback, bounding by δ the error of what is served.

Reference: "vCache: Verified Semantic Prompt Caching" (2025). Per entry, P(correct | similarity s) is
modelled as a logistic sigmoid(w0 + w1·(u(s) - u(0.8))) in u(s) = -ln(1 - s), fitted by MAP with a
Laplace posterior on that entry's own (s, correct) feedback. The prior of every entry is the pooled
model (the same logistic over all entries' recent feedback) widened by a between-entry spread, so a cold
entry starts from what the population has learned and its own labels move it from there. A candidate is
served when the upper confidence bound on its error, 1 - sigmoid(ẑ - z_conf·sd(ẑ)), is at most δ; where
the bound says "maybe" (the optimistic estimate would serve) it is explored with probability
`explore_rate`: the caller asks the model anyway and reports whether the answers agree. Until the pool
holds `min_labels` labels nothing is trusted: serve only at `cold_threshold` or above, explore the rest
above `explore_floor`.

Parameters (defaults): δ 0.02 (vCache's default), z_conf 1.645 (one-sided 95%), explore_rate 0.2,
cold_threshold 0.97, explore_floor 0.5, min_labels 20, 32 labels kept per entry, 4,096 in the pool.
Everything here is pure: the caller passes the random draw and persists `EntryThreshold.to_dict()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

LOGIT_CLIP = 30.0
MAX_SIMILARITY = 0.9999


def feature(s: float | np.ndarray) -> float | np.ndarray:
    """-ln(1 - s): cosines crowd just below 1, where 0.95 and 0.99 mean very different things; on this
    scale a logistic can be steep at the top without being forced steep over the whole range."""
    return -np.log1p(-np.minimum(s, MAX_SIMILARITY))


CENTER = float(feature(0.8))  # the intercept is measured at cosine 0.8: keeps the 2x2 fit well conditioned


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-LOGIT_CLIP, min(LOGIT_CLIP, z))))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def fit_logistic(
    sims: np.ndarray,
    labels: np.ndarray,
    prior_mean: np.ndarray,
    prior_cov: np.ndarray,
    iterations: int = 25,
) -> tuple[np.ndarray, np.ndarray]:
    """MAP weights and Laplace covariance of a 2-parameter logistic under a Gaussian prior (Newton)."""
    x = np.column_stack([np.ones_like(sims), feature(sims) - CENTER])
    precision = np.linalg.inv(prior_cov)

    def objective(w: np.ndarray) -> float:  # log posterior, up to a constant
        z = x @ w
        return float(
            labels @ z - np.logaddexp(0.0, z).sum() - 0.5 * (w - prior_mean) @ precision @ (w - prior_mean)
        )

    w = prior_mean.astype(np.float64).copy()
    current = objective(w)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -LOGIT_CLIP, LOGIT_CLIP)))
        grad = x.T @ (labels - p) - precision @ (w - prior_mean)
        hessian = (x.T * (p * (1.0 - p))) @ x + precision
        step = np.linalg.solve(hessian, grad)
        # Backtracking: a full Newton step can overshoot when labels separate perfectly.
        for _ in range(30):
            if (candidate := objective(w + step)) >= current:
                break
            step = step / 2
        w, current = w + step, max(candidate, current)
        if float(np.max(np.abs(step))) < 1e-6:
            break
    p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -LOGIT_CLIP, LOGIT_CLIP)))
    hessian = (x.T * (p * (1.0 - p))) @ x + precision
    return w, np.linalg.inv(hessian)


@dataclass(frozen=True, slots=True)
class Posterior:
    """Gaussian belief over (w0, w1); `bounds(s)` gives the pessimistic and optimistic P(correct)."""

    mean: tuple[float, float]
    cov: tuple[tuple[float, float], tuple[float, float]]

    def logit(self, s: float) -> tuple[float, float]:
        d = float(feature(s)) - CENTER
        z = self.mean[0] + self.mean[1] * d
        var = self.cov[0][0] + 2 * d * self.cov[0][1] + d * d * self.cov[1][1]
        return z, math.sqrt(max(var, 0.0))

    def bounds(self, s: float, z_conf: float) -> tuple[float, float]:
        z, sd = self.logit(s)
        return _sigmoid(z - z_conf * sd), _sigmoid(z + z_conf * sd)

    def crossing(self, target_logit: float, z_conf: float, lo: float = 0.0) -> float:
        """Smallest similarity in [lo, 1] where z - z_conf·sd reaches `target_logit` (inf if none).

        z_conf < 0 gives the optimistic crossing. Assumes the bound rises with s above the crossing,
        which holds once w1 > 0 is learned; bisection keeps it cheap (30 steps)."""

        def ok(s: float) -> bool:
            z, sd = self.logit(s)
            return z - z_conf * sd >= target_logit

        if not ok(1.0):
            return math.inf
        hi = 1.0
        if ok(lo):
            return lo
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        return hi

    @classmethod
    def of(cls, mean: np.ndarray, cov: np.ndarray) -> Posterior:
        return cls(
            (float(mean[0]), float(mean[1])),
            ((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        )


@dataclass(slots=True)
class EntryThreshold:
    """One cached entry's feedback and its fitted belief (persist `to_dict()` with the entry)."""

    sims: list[float] = field(default_factory=list)
    labels: list[bool] = field(default_factory=list)
    # Cache of the fit, valid while `fitted_for` equals the pool's version it was fitted against.
    posterior: Posterior | None = None
    fitted_for: int = -1

    @property
    def labelled(self) -> int:
        return len(self.sims)

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
    error_bound: float | None  # upper confidence bound on P(wrong); None while cold
    cold: bool
    reason: str


@dataclass
class ThresholdLearner:
    """The pooled model plus the per-entry rule; one per model (or namespace) with its own δ."""

    delta: float = 0.02
    z_conf: float = 1.645
    explore_rate: float = 0.2
    cold_threshold: float = 0.97
    explore_floor: float = 0.5
    min_labels: int = 20
    max_entry_labels: int = 32
    max_pool_labels: int = 4096
    # Between-entry spread added to the pooled covariance to form an entry's prior (intercept, slope).
    entry_spread: tuple[float, float] = (0.25, 0.5)
    # Weak prior of the pool: boundary at cosine 0.9, slope 3 per unit of u, both loosely held.
    prior_mean: tuple[float, float] = (-2.08, 3.0)
    prior_sd: tuple[float, float] = (4.0, 6.0)
    refit_every: int = 8
    pool_sims: list[float] = field(default_factory=list)
    pool_labels: list[bool] = field(default_factory=list)
    version: int = 0
    _pooled: Posterior | None = field(default=None, repr=False)
    _pending: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.delta < 0.5:
            raise ValueError(f"delta must be in (0, 0.5), got {self.delta}")
        if not 0.0 <= self.explore_rate <= 1.0:
            raise ValueError(f"explore_rate must be in [0, 1], got {self.explore_rate}")

    # -- feedback ---------------------------------------------------------------------------------------

    def observe(self, entry: EntryThreshold, similarity: float, correct: bool) -> None:
        """A label for a candidate at `similarity` of `entry`: from user feedback or an exploration."""
        entry.sims.append(float(similarity))
        entry.labels.append(bool(correct))
        del entry.sims[: -self.max_entry_labels], entry.labels[: -self.max_entry_labels]
        entry.fitted_for = -1
        self.pool_sims.append(float(similarity))
        self.pool_labels.append(bool(correct))
        del self.pool_sims[: -self.max_pool_labels], self.pool_labels[: -self.max_pool_labels]
        self._pending += 1
        if len(self.pool_sims) < 64 or self._pending >= self.refit_every:
            self._refit()

    def _refit(self) -> None:
        self._pending = 0
        self.version += 1
        self._pooled = Posterior.of(
            *fit_logistic(
                np.asarray(self.pool_sims),
                np.asarray(self.pool_labels, dtype=np.float64),
                np.asarray(self.prior_mean),
                np.diag(np.square(self.prior_sd)),
            )
        )

    @property
    def cold(self) -> bool:
        return len(self.pool_sims) < self.min_labels or self._pooled is None

    def posterior(self, entry: EntryThreshold | None) -> Posterior:
        """The belief for this entry: the pool widened by the spread, updated by the entry's own labels."""
        assert self._pooled is not None
        pooled = self._pooled
        prior_mean = np.asarray(pooled.mean)
        prior_cov = np.asarray(pooled.cov) + np.diag(np.square(self.entry_spread))
        if entry is None or not entry.sims:
            return Posterior.of(prior_mean, prior_cov)
        if entry.posterior is None or entry.fitted_for != self.version:
            entry.posterior = Posterior.of(
                *fit_logistic(
                    np.asarray(entry.sims),
                    np.asarray(entry.labels, dtype=np.float64),
                    prior_mean,
                    prior_cov,
                )
            )
            entry.fitted_for = self.version
        return entry.posterior

    # -- decision ---------------------------------------------------------------------------------------

    def thresholds(self, entry: EntryThreshold | None) -> tuple[float, float]:
        """(serve from, explore from) similarities for this entry under δ."""
        if self.cold:
            return self.cold_threshold, self.explore_floor
        post = self.posterior(entry)
        target = _logit(1.0 - self.delta)
        serve = post.crossing(target, self.z_conf)
        explore = post.crossing(target, -self.z_conf, lo=self.explore_floor)
        if explore == math.inf:
            # Even the optimistic bound never serves: keep probing the near-exact band, or a pessimistic
            # fit would never see the labels that could correct it.
            explore = self.cold_threshold
        return serve, min(explore, serve)

    def assess(self, entry: EntryThreshold | None, similarity: float, draw: float) -> Assessment:
        """Serve, explore or miss a candidate; `draw` is a uniform [0, 1) number from the caller's RNG."""
        serve_from, explore_from = self.thresholds(entry)
        cold = self.cold
        bound = None if cold else 1.0 - self.posterior(entry).bounds(similarity, self.z_conf)[0]
        tag = "cold" if cold else f"error bound {bound:.3f} vs δ {self.delta}"
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

    # -- persistence ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "pool_sims": [round(s, 6) for s in self.pool_sims],
            "pool_labels": [int(c) for c in self.pool_labels],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], **options: Any) -> ThresholdLearner:
        learner = cls(delta=float(data["delta"]), **options)
        learner.pool_sims = list(map(float, data.get("pool_sims", [])))
        learner.pool_labels = [bool(c) for c in data.get("pool_labels", [])]
        if learner.pool_sims:
            learner._refit()
        return learner
