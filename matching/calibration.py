"""A pooled model of P(a candidate is the right answer | its similarity), fitted across all entries, and the
upper confidence bound it gives on the error rate served from a threshold.

Reference: vCache ("vCache: Verified Semantic Prompt Caching", 2025) fits a sigmoid of the similarity
to labelled candidates and serves where its confidence bound clears δ; here the sigmoid is pooled over
every entry and fitted on u = -ln(1 - s). Weighted logistic regression (Newton, a weak Gaussian prior
with `prior_sd` on both coefficients), Laplace covariance and the delta method for the bound on the
served error. Why and how: docs/tiers.md ("The pooled sigmoid").
"""

from __future__ import annotations

import numpy as np

MAX_SIM = 0.9999  # similarities above this are treated as this (u stays finite)


def transform(sims: np.ndarray) -> np.ndarray:
    return -np.log1p(-np.minimum(np.asarray(sims, dtype=np.float64), MAX_SIM))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def fit_logistic(
    sims: np.ndarray, correct: np.ndarray, weights: np.ndarray, prior_sd: float = 10.0, iters: int = 30
) -> tuple[np.ndarray, np.ndarray]:
    """(theta = [a, b], covariance) of P(correct) = sigmoid(a + b u), u = transform(s)."""
    x = np.stack([np.ones(len(sims)), transform(sims)], axis=1)
    y = np.asarray(correct, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    # The weights say how much each label stands for; the information is that of n_eff labels.
    n_eff = w.sum() ** 2 / max(float((w * w).sum()), 1e-12)
    w = w * (n_eff / max(float(w.sum()), 1e-12))
    prior = np.eye(2) / prior_sd**2
    theta = np.zeros(2)
    hessian = prior
    for _ in range(iters):
        p = _sigmoid(x @ theta)
        grad = x.T @ (w * (y - p)) - prior @ theta
        hessian = (x * (w * p * (1 - p))[:, None]).T @ x + prior
        step = np.linalg.solve(hessian, grad)
        theta = theta + step
        if np.abs(step).max() < 1e-8:
            break
    p = _sigmoid(x @ theta)
    hessian = (x * (w * p * (1 - p))[:, None]).T @ x + prior
    return theta, np.linalg.inv(hessian)


def served_error_bound(
    grid: np.ndarray,
    sims: np.ndarray,
    weights: np.ndarray,
    theta: np.ndarray,
    cov: np.ndarray,
    z: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(estimate, upper bound) of the error served from each t in `grid`: the model's P(wrong) averaged
    over the weighted candidates with similarity >= t (1 where there are none)."""
    order = np.argsort(sims)
    s, w = np.asarray(sims, dtype=np.float64)[order], np.asarray(weights, dtype=np.float64)[order]
    u = transform(s)
    p_wrong = 1.0 - _sigmoid(theta[0] + theta[1] * u)
    # d P(wrong) / d theta = -p (1 - p) * [1, u]
    slope = p_wrong * (1.0 - p_wrong)

    def suffix(v: np.ndarray) -> np.ndarray:
        return np.concatenate([np.cumsum(v[::-1])[::-1], [0.0]])

    at = np.searchsorted(s, grid, side="left")
    total = suffix(w)[at]
    safe = np.where(total > 0, total, 1.0)
    estimate = suffix(w * p_wrong)[at] / safe
    ga = -suffix(w * slope)[at] / safe
    gb = -suffix(w * slope * u)[at] / safe
    var = ga * ga * cov[0, 0] + 2 * ga * gb * cov[0, 1] + gb * gb * cov[1, 1]
    upper = estimate + z * np.sqrt(np.maximum(var, 0.0))
    empty = total <= 0
    return np.where(empty, 1.0, estimate), np.where(empty, 1.0, np.minimum(upper, 1.0))


def point_error_bound(sims: np.ndarray, theta: np.ndarray, cov: np.ndarray, z: float) -> np.ndarray:
    """Upper bound on P(wrong | s) at each similarity (vCache's pointwise rule)."""
    u = transform(sims)
    eta = theta[0] + theta[1] * u
    sd = np.sqrt(np.maximum(cov[0, 0] + 2 * u * cov[0, 1] + u * u * cov[1, 1], 0.0))
    return 1.0 - _sigmoid(eta - z * sd)
