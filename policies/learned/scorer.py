"""The heat scorer: a small torch MLP mapping entry features to P(re-use within a horizon), in [0, 1].

docs/design.md §1.2 ("a lightweight MLP scores online, updated every 100 ms"). Architecture: features -> 16 ->
16 -> 1, tanh hidden units, sigmoid output, Adam (lr 5e-3), binary cross-entropy on labels from
`ReuseLabeler`: a sampled entry is positive when it is heard again within `horizon` accesses. Training
draws minibatches from a FIFO buffer of recent labels, so the model follows a drifting workload.
Inference runs on a numpy copy of the weights (the reference kernel; the torch forward is tested
against it), refreshed after every training step. Deterministic for a given seed on one thread.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

import numpy as np
import torch
from torch import nn


class HeatMLP(nn.Module):
    def __init__(self, n_features: int, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x)).squeeze(-1)


def numpy_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The reference forward pass: alternating (W, b) pairs, tanh between, sigmoid at the end."""
    h = x
    last = len(weights) // 2 - 1
    for i in range(0, len(weights), 2):
        h = h @ weights[i] + weights[i + 1]
        if i // 2 < last:
            h = np.tanh(h)
    z = h[..., 0] if h.ndim > 1 else h
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v), dtype=np.float64)
    ranks[order] = np.arange(len(v))
    return ranks


def rank_correlation(pred: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation (ties broken by position), 0 when either side is constant."""
    if len(y) < 2 or np.ptp(pred) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(np.corrcoef(_ranks(pred), _ranks(y))[0, 1])


class HeatScorer:
    """Online-trained heat model. `score` is numpy and cheap; `train` takes a few Adam steps."""

    def __init__(
        self,
        n_features: int,
        *,
        hidden: int = 16,
        lr: float = 5e-3,
        batch: int = 128,
        buffer: int = 4096,
        seed: int = 0,
        keep: np.ndarray | None = None,
    ) -> None:
        self.n_features = n_features
        # Ablation: the model reads (and learns from) `x * keep`; None, the default, reads x as is.
        self.keep = keep
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = HeatMLP(n_features, hidden)
        # Fused: one kernel per step instead of a dozen small ops per tensor (a third cheaper on a
        # model this small, where the per-op overhead is the cost).
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, fused=True)
        self.loss = nn.BCELoss()
        self.batch = batch
        self._x = np.zeros((buffer, n_features), dtype=np.float32)
        self._y = np.zeros(buffer, dtype=np.float32)
        self._filled = 0
        self._next = 0
        self._rng = np.random.default_rng(seed)
        self.labels_seen = 0
        self.steps = 0
        self._weights = self._export()

    def _export(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for layer in self.model.net:
            if isinstance(layer, nn.Linear):
                out.append(layer.weight.detach().numpy().T.astype(np.float32).copy())
                out.append(layer.bias.detach().numpy().astype(np.float32).copy())
        return out

    def refresh(self) -> None:
        """Copy the torch weights to the numpy kernel again (after loading a checkpoint)."""
        self._weights = self._export()

    def score(self, x: np.ndarray) -> np.ndarray:
        """Heat in [0, 1] for each row of `x` (numpy path)."""
        if self.keep is not None:
            x = x * self.keep
        return numpy_forward(self._weights, x)

    def torch_score(self, x: np.ndarray) -> np.ndarray:
        if self.keep is not None:
            x = x * self.keep
        with torch.no_grad():
            return self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    def observe(self, x: np.ndarray, y: float) -> None:
        i = self._next
        self._x[i] = x if self.keep is None else x * self.keep
        self._y[i] = y
        self._next = (i + 1) % len(self._y)
        self._filled = min(self._filled + 1, len(self._y))
        self.labels_seen += 1

    def train(self, steps: int = 1) -> float | None:
        n = self._filled
        if n < min(self.batch, 64):
            return None
        xs, ys = self._x, self._y
        loss_value = 0.0
        for _ in range(steps):
            pick = self._rng.integers(0, n, size=min(self.batch, n))
            xb = torch.from_numpy(xs[pick])
            yb = torch.from_numpy(ys[pick])
            self.optimizer.zero_grad()
            loss = self.loss(self.model(xb), yb)
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.item())
        self.steps += steps
        self._weights = self._export()
        return loss_value


class ReuseLabeler:
    """Turns sampled feature rows into labels: re-used within `horizon` ticks or not.

    With `graded` (the default) a re-use at distance d scores 1 - log1p(d) / log1p(horizon), so the
    label also says how soon, which orders entries the way Belady would; otherwise it is 1/0.
    One pending sample per key at a time keeps memory bounded.
    """

    def __init__(self, horizon: int, graded: bool = True) -> None:
        self.horizon = horizon
        self.graded = graded
        self._log_horizon = math.log1p(horizon)
        self._pending: dict[Hashable, tuple[int, np.ndarray]] = {}
        self._order: deque[tuple[int, Hashable]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def watch(self, key: Hashable, x: np.ndarray, tick: int) -> None:
        if key in self._pending:
            return
        self._pending[key] = (tick, x)
        self._order.append((tick, key))

    def heard(self, key: Hashable, tick: int, scorer: HeatScorer) -> None:
        sample = self._pending.pop(key, None)
        if sample is not None:
            started, x = sample
            scorer.observe(x, self.label(tick - started))

    def label(self, distance: int) -> float:
        if distance > self.horizon:
            return 0.0
        if not self.graded:
            return 1.0
        return 1.0 - math.log1p(max(distance, 0)) / self._log_horizon

    def expire(self, tick: int, scorer: HeatScorer) -> None:
        order = self._order
        while order and tick - order[0][0] > self.horizon:
            started, key = order.popleft()
            sample = self._pending.get(key)
            if sample is not None and sample[0] == started:
                del self._pending[key]
                scorer.observe(sample[1], 0.0)
