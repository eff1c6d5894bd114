"""Head-heat sharding (docs/design.md §3.1): per attention head, the rolling variance of its reported
heat over the last 64 steps, a softmax with temperature 0.1, normalised by the maximum to [0, 1], then
classes cold [0, 0.3) / warm [0.3, 0.7) / hot [0.7, 1] with the design's resource quotas (2 vCPU/4 GB,
4 vCPU/8 GB, 8 vCPU/16 GB + GPU). A head changes class only once its score is `hysteresis` past the
boundary, so a head that hovers near 0.3 or 0.7 does not flap between shards.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

HeadClass = Literal["cold", "warm", "hot"]
BOUNDS = (0.3, 0.7)
QUOTAS: dict[HeadClass, dict[str, object]] = {
    "cold": {"vcpu": 2, "memory_gb": 4, "gpu": False},
    "warm": {"vcpu": 4, "memory_gb": 8, "gpu": False},
    "hot": {"vcpu": 8, "memory_gb": 16, "gpu": True},
}


def head_scores(history: np.ndarray, temperature: float = 0.1) -> np.ndarray:
    """`history` is steps x heads; returns each head's score in [0, 1] (1 for the most active)."""
    if history.ndim != 2 or history.shape[0] == 0:
        raise ValueError(f"need a steps x heads history, got shape {history.shape}")
    variance = history.var(axis=0)
    z = variance / temperature
    weights = np.exp(z - z.max())
    weights /= weights.sum()
    top = weights.max()
    return weights / top if top > 0 else np.zeros_like(weights)


def classify(score: float, previous: HeadClass | None = None, hysteresis: float = 0.05) -> HeadClass:
    low, high = BOUNDS
    plain: HeadClass = "cold" if score < low else "warm" if score < high else "hot"
    if previous is None or plain == previous:
        return plain
    # Leave the previous class only when clearly past its boundary.
    if previous == "cold" and score < low + hysteresis:
        return "cold"
    if previous == "hot" and score >= high - hysteresis:
        return "hot"
    if previous == "warm" and low - hysteresis <= score < high + hysteresis:
        return "warm"
    return plain


@dataclass(frozen=True, slots=True)
class ShardPlan:
    model: str
    scores: tuple[float, ...]
    classes: tuple[HeadClass, ...]
    steps: int

    def heads_by_class(self) -> dict[HeadClass, list[int]]:
        out: dict[HeadClass, list[int]] = {"cold": [], "warm": [], "hot": []}
        for head, cls in enumerate(self.classes):
            out[cls].append(head)
        return out


class HeadHeat:
    """Rolling per-head history for one model and the shard plan it implies."""

    def __init__(
        self, model: str, window_steps: int = 64, temperature: float = 0.1, hysteresis: float = 0.05
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.hysteresis = hysteresis
        self._rows: deque[np.ndarray] = deque(maxlen=window_steps)
        self._classes: list[HeadClass] | None = None
        self.steps = 0

    def observe(self, head_heat: list[float]) -> None:
        row = np.asarray(head_heat, dtype=np.float64)
        if self._rows and len(row) != len(self._rows[0]):
            # The engine reports another head count (a model reload): start over.
            self._rows.clear()
            self._classes = None
        self._rows.append(row)
        self.steps += 1

    def plan(self) -> ShardPlan | None:
        """The plan after the latest step when some head changed class (the first plan counts as a
        change); None while nothing changed, or before two steps give a variance."""
        if len(self._rows) < 2:
            return None
        scores = head_scores(np.stack(self._rows), self.temperature)
        previous: list[HeadClass | None] = [None] * len(scores)
        if self._classes is not None and len(self._classes) == len(scores):
            previous = list(self._classes)
        classes = [classify(float(s), p, self.hysteresis) for s, p in zip(scores, previous, strict=True)]
        changed = classes != self._classes
        self._classes = classes
        plan = ShardPlan(self.model, tuple(round(float(s), 4) for s in scores), tuple(classes), self.steps)
        return plan if changed else None
