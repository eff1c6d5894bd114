"""Hot/cold key drift: per-key features, DBSCAN per window, and pulse / migrating / stable labels
(docs/design.md §2.4).

Features per key and window: [log1p(count in window), exp(-0.1 * seconds since the key's last access),
call depth], for keys accessed at least `min_key_accesses` times. DBSCAN (Ester, Kriegel, Sander & Xu,
KDD 1996) with eps = eps_scale * RMS distance of the keys to their centroid, so each window is judged on
its own scale. Labels: pulse = duration < 8 s, variance >= 1, service spread < 15%; migrating = 30-120 s,
variance < 1, spread > 65%; anything else is stable. What duration, variance and spread measure:
docs/streams.md ("Drift clusters").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.cluster import DBSCAN

from schemas.events import DriftPattern

RECENCY_DECAY_PER_S = 0.1
FEATURE_DECIMALS = 2


@dataclass(frozen=True, slots=True)
class DriftParams:
    min_samples: int = 4
    eps_scale: float = 0.25
    min_eps: float = 0.05
    # Keys beyond this many (the least accessed) are left out of one window's clustering.
    max_keys: int = 5_000
    min_key_accesses: int = 3
    pulse_max_ms: int = 8_000
    pulse_min_variance: float = 1.0
    pulse_max_spread: float = 0.15
    migrating_min_ms: int = 30_000
    migrating_max_ms: int = 120_000
    migrating_min_variance: float = 0.0
    migrating_max_variance: float = 1.0
    migrating_min_spread: float = 0.65


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """One key's activity in one window (a row of `WindowKeys`)."""

    key: str
    count: int
    last_ms: int
    depth: int
    services: frozenset[str]
    active_since_ms: int
    # Accesses per pane, oldest pane first.
    pane_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cluster:
    keys: tuple[str, ...]  # most accessed first
    duration_ms: int
    variance: float
    service_spread: float
    pattern: DriftPattern
    eps: float


@dataclass(slots=True)
class WindowKeys:
    """One window's keys as columns (row i is one key), the shape the clustering works on."""

    keys: list[str]
    count: np.ndarray  # int64
    last_ms: np.ndarray  # int64
    depth: np.ndarray  # int64
    active_since_ms: np.ndarray  # int64
    pane_counts: np.ndarray  # (keys, panes) int64, oldest pane first
    services: list[frozenset[str]]

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def from_rows(cls, rows: Sequence[KeyWindow]) -> WindowKeys:
        panes = max((len(r.pane_counts) for r in rows), default=0)
        counts = np.zeros((len(rows), panes), dtype=np.int64)
        for i, r in enumerate(rows):
            counts[i, : len(r.pane_counts)] = r.pane_counts
        return cls(
            keys=[r.key for r in rows],
            count=np.array([r.count for r in rows], dtype=np.int64),
            last_ms=np.array([r.last_ms for r in rows], dtype=np.int64),
            depth=np.array([r.depth for r in rows], dtype=np.int64),
            active_since_ms=np.array([r.active_since_ms for r in rows], dtype=np.int64),
            pane_counts=counts,
            services=[r.services for r in rows],
        )

    def take(self, rows: np.ndarray) -> WindowKeys:
        index = rows.tolist()
        return WindowKeys(
            keys=[self.keys[i] for i in index],
            count=self.count[rows],
            last_ms=self.last_ms[rows],
            depth=self.depth[rows],
            active_since_ms=self.active_since_ms[rows],
            pane_counts=self.pane_counts[rows],
            services=[self.services[i] for i in index],
        )


def features(keys: WindowKeys | Sequence[KeyWindow], window_end_ms: int) -> np.ndarray:
    """The (n, 3) feature matrix, one row per key."""
    if not isinstance(keys, WindowKeys):
        keys = WindowKeys.from_rows(keys)
    idle_s = np.maximum(0, window_end_ms - keys.last_ms) / 1000.0
    return np.column_stack(
        [
            np.log1p(keys.count.astype(np.float64)),
            np.exp(-RECENCY_DECAY_PER_S * idle_s),
            keys.depth.astype(np.float64),
        ]
    ).reshape(len(keys), 3)


def eps_from_spread(x: np.ndarray, scale: float, floor: float) -> float:
    """eps = scale * RMS distance to the centroid (the window's spread), at least `floor`."""
    if len(x) == 0:
        return floor
    spread = math.sqrt(float(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean()))
    return max(floor, scale * spread)


def dbscan_labels(x: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """Cluster index per row, -1 for noise. Identical rows are clustered once, weighted by how many
    there are: the same result, without DBSCAN's neighbour lists growing with the square of a
    window full of look-alike cold keys."""
    if len(x) == 0:
        return np.empty(0, dtype=np.int64)
    unique, inverse, weights = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    labels: np.ndarray = DBSCAN(eps=eps, min_samples=min_samples).fit_predict(unique, sample_weight=weights)
    return labels[inverse.reshape(-1)]


def burst_variance(pane_totals: Sequence[int]) -> float:
    """Squared coefficient of variation of per-pane counts: var / mean^2 (population)."""
    n = len(pane_totals)
    total = sum(pane_totals)
    if n == 0 or total == 0:
        return 0.0
    mean = total / n
    var = sum((c - mean) ** 2 for c in pane_totals) / n
    return var / (mean * mean)


def label(
    duration_ms: int, variance: float, spread: float, params: DriftParams, median_accesses: int | None = None
) -> DriftPattern:
    if median_accesses is not None and median_accesses < params.min_key_accesses:
        return "stable"
    if (
        duration_ms < params.pulse_max_ms
        and variance >= params.pulse_min_variance
        and spread < params.pulse_max_spread
    ):
        return "pulse"
    if (
        params.migrating_min_ms <= duration_ms <= params.migrating_max_ms
        and params.migrating_min_variance <= variance < params.migrating_max_variance
        and spread > params.migrating_min_spread
    ):
        return "migrating"
    return "stable"


def cluster_window(
    keys: WindowKeys | Sequence[KeyWindow], window_end_ms: int, params: DriftParams
) -> list[Cluster]:
    """DBSCAN over one window's keys; clusters in a deterministic order (by their first key)."""
    if not isinstance(keys, WindowKeys):
        keys = WindowKeys.from_rows(keys)
    all_services: set[str] = set().union(*keys.services)
    # Drift is about hot keys: the cold ones (most of a window) are not clustered at all.
    hot = np.flatnonzero(keys.count >= params.min_key_accesses)
    if params.max_keys and len(hot) > params.max_keys:
        # The most accessed keys, ties by name.
        names = np.array([keys.keys[i] for i in hot.tolist()], dtype=object)
        by_name = hot[np.argsort(names, kind="stable")]
        hot = by_name[np.argsort(-keys.count[by_name], kind="stable")][: params.max_keys]
    keys = keys.take(np.array(sorted(hot.tolist(), key=keys.keys.__getitem__), dtype=np.int64))
    if len(keys) < params.min_samples:
        return []
    # Rounded well below any eps that matters, so near-identical keys become identical rows.
    x = np.round(features(keys, window_end_ms), FEATURE_DECIMALS)
    eps = eps_from_spread(x, params.eps_scale, params.min_eps)
    labels = dbscan_labels(x, eps, params.min_samples)
    found = [lab for lab in dict.fromkeys(labels.tolist()) if lab >= 0]  # in order of first key
    clusters: list[Cluster] = []
    for lab in found:
        rows = np.flatnonzero(labels == lab)
        durations = np.sort(np.maximum(0, window_end_ms - keys.active_since_ms[rows]))
        duration = int(durations[len(rows) // 2])
        median_accesses = int(np.sort(keys.count[rows])[len(rows) // 2])
        variance = burst_variance(keys.pane_counts[rows].sum(axis=0).tolist())
        services: set[str] = set().union(*(keys.services[i] for i in rows.tolist()))
        spread = len(services) / len(all_services) if all_services else 0.0
        ordered = sorted(rows.tolist(), key=lambda i: (-int(keys.count[i]), keys.keys[i]))
        clusters.append(
            Cluster(
                keys=tuple(keys.keys[i] for i in ordered),
                duration_ms=duration,
                variance=variance,
                service_spread=spread,
                pattern=label(duration, variance, spread, params, median_accesses),
                eps=eps,
            )
        )
    return clusters


def advance_runs(
    active_since: Mapping[str, int], first_seen_in_window: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """Carries activity runs from the previous hopping window to this one.

    A key present in consecutive windows keeps its start; a key new to the window starts a run at
    its first access in it; a key absent from the window (idle for a whole window) ends its run.
    Returns (runs now, runs started, runs ended).
    """
    runs: dict[str, int] = {}
    started: dict[str, int] = {}
    for key, first in first_seen_in_window.items():
        since = active_since.get(key)
        if since is None:
            runs[key] = started[key] = first
        else:
            runs[key] = since
    ended = [key for key in active_since if key not in first_seen_in_window]
    return runs, started, ended
