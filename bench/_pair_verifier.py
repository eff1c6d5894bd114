"""A grey-zone verifier: pair signals beyond one cosine, combined by a logistic model.

Signals of a (cached, request) pair, each cheap and general English: the cosine (as calibration.py's
u), content-word and character-trigram overlap, the length ratio, content words on one side only, word
order among the shared words, and the guards' families as degrees (negations, quantities, entities, the
question word) instead of vetoes. `Verifier` is a logistic model over them: P(same question).
bench/semantic_verifier.py fits it leave-one-data-set-out and says whether it earns a place in the
node; it lives here, not in matching/, until it does.
Pure: the weights are data (`to_dict` / `from_dict`), `fit` is Newton's method with an L2 prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from matching import calibration, guards

FEATURES: tuple[str, ...] = (
    "u",  # -log(1 - cosine)
    "content_jaccard",
    "trigram_jaccard",
    "length_ratio",  # |log(words a / words b)|
    "unshared",  # content words on one side only, over all content words
    "order",  # discordant pairs among the shared content words, over all their pairs
    "negation_gap",  # |negations a - negations b|, at most 2
    "quantities_differ",
    "entity_distance",  # 1 - Jaccard of the named entities (0 when neither names one)
    "question_word_differs",
    "contained",  # one side's content words are a strict subset of the other's
)
_STOP = frozenset(
    "a an the of to in on at for by with from and or but is are was were be been being do does did "
    "i you he she it we they me my your his her its our their this that these those there here as "
    "so if then than can could would should will shall may might must have has had what which who "
    "whom whose how why when where".split()
)
_QUESTION_WORDS = frozenset("what which who whom whose how why when where".split())


def _content(words: tuple[str, ...]) -> list[str]:
    return [w for w in words if w not in _STOP]


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def _trigrams(text: str) -> set[str]:
    t = " ".join(text.lower().split())
    return {t[i : i + 3] for i in range(max(len(t) - 2, 1))}


def _discordance(a: list[str], b: list[str]) -> float:
    """Kendall distance of the shared words' first positions in a and in b (0: same order)."""
    pos_b: dict[str, int] = {}
    for i, w in enumerate(b):
        pos_b.setdefault(w, i)
    seen: set[str] = set()
    order: list[int] = []
    for w in a:
        if w in pos_b and w not in seen:
            seen.add(w)
            order.append(pos_b[w])
    n = len(order)
    if n < 2:
        return 0.0
    discordant = sum(1 for i in range(n) for j in range(i + 1, n) if order[i] > order[j])
    return discordant / (n * (n - 1) / 2)


def _question_word(words: tuple[str, ...]) -> str:
    return next((w for w in words[:4] if w in _QUESTION_WORDS), "")


def features(cached: str, request: str, similarity: float) -> np.ndarray:
    """The signals of one pair, in FEATURES' order."""
    wa, wb = guards._words(cached), guards._words(request)
    ca, cb = _content(wa), _content(wb)
    sa, sb = set(ca), set(cb)
    union = sa | sb
    qa, qb = guards._quantities(cached), guards._quantities(request)
    ea, eb = set(guards._entities(cached)), set(guards._entities(request))
    qwa, qwb = _question_word(wa), _question_word(wb)
    return np.array(
        [
            float(calibration.transform(np.array([similarity]))[0]),
            _jaccard(sa, sb),
            _jaccard(_trigrams(cached), _trigrams(request)),
            abs(math.log((len(wa) + 1) / (len(wb) + 1))),
            len(sa ^ sb) / len(union) if union else 0.0,
            _discordance(ca, cb),
            min(abs(guards._negations(cached) - guards._negations(request)), 2),
            float((qa[0] + qa[1]) != (qb[0] + qb[1])),
            1.0 - _jaccard(ea, eb) if ea | eb else 0.0,
            float(bool(qwa) and bool(qwb) and qwa != qwb),
            float(sa != sb and (sa < sb or sb < sa)),
        ]
    )


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@dataclass(frozen=True, slots=True)
class Verifier:
    """P(same question) = sigmoid(bias + weights . (features - mean) / scale)."""

    bias: float
    weights: np.ndarray
    mean: np.ndarray
    scale: np.ndarray

    def score_features(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(x) - self.mean) / self.scale
        return _sigmoid(self.bias + z @ self.weights)

    def score(self, cached: str, request: str, similarity: float) -> float:
        return float(self.score_features(features(cached, request, similarity))[0])

    @classmethod
    def fit(
        cls, x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, prior_sd: float = 3.0
    ) -> Verifier:
        """Weighted logistic regression (Newton, Gaussian prior of `prior_sd` on standardised weights)."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale = np.where(scale > 1e-9, scale, 1.0)
        z = np.hstack([np.ones((len(y), 1)), (x - mean) / scale])
        prior = np.eye(z.shape[1]) / prior_sd**2
        prior[0, 0] = 0.0
        theta = np.zeros(z.shape[1])
        for _ in range(50):
            p = _sigmoid(z @ theta)
            grad = z.T @ (w * (y - p)) - prior @ theta
            hessian = (z * (w * p * (1 - p))[:, None]).T @ z + prior
            step = np.linalg.solve(hessian, grad)
            theta = theta + step
            if np.abs(step).max() < 1e-8:
                break
        return cls(float(theta[0]), theta[1:], mean, scale)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "bias": self.bias,
            "weights": self.weights.tolist(),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verifier:
        if list(data.get("features", [])) != list(FEATURES):
            raise ValueError("verifier weights were fitted on other features")
        return cls(
            float(data["bias"]),
            np.asarray(data["weights"], dtype=np.float64),
            np.asarray(data["mean"], dtype=np.float64),
            np.asarray(data["scale"], dtype=np.float64),
        )


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the chance a random positive outranks a random negative; ties half)."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))
