"""Per-entry heat features, kept in slot arrays so a whole cache is featurised in one numpy pass.

Features (docs/design.md §1.2; all scaled to about [0, 1]): recency and inter-access gap on a log scale of a
logical clock (accesses heard), sketch frequency at the last access, hits while resident, the
attention-head heat kv.events.v1 reported (and whether any was), size, TTL left, whether the
entry's trace is still alive, prefix depth, resident children, and the heat of its semantic cluster
from the previous scoring round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from policies.base import AccessMeta

FEATURES: tuple[str, ...] = (
    "recency",
    "interval",
    "frequency",
    "hits",
    "attention",
    "has_attention",
    "size",
    "ttl_left",
    "trace_alive",
    "depth",
    "children",
    "neighbour_heat",
)
N_FEATURES = len(FEATURES)
NO_GAP = -1
# Feature groups, for ablation (`HeatPolicy(ablate=...)` zeroes a group's columns in what the model
# reads and learns from; the fixed prior and the eviction bookkeeping are not affected).
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "recency": ("recency", "interval"),
    "frequency": ("frequency", "hits"),
    "attention": ("attention", "has_attention"),
    "size": ("size",),
    "lifecycle": ("ttl_left", "trace_alive"),
    "chain": ("depth", "children"),
    "semantic": ("neighbour_heat",),
}


def keep_mask(groups: Sequence[str]) -> np.ndarray | None:
    """A 0/1 row over `FEATURES` with the columns of `groups` zeroed; None when none is named."""
    if not groups:
        return None
    unknown = sorted(set(groups) - FEATURE_GROUPS.keys())
    if unknown:
        raise ValueError(f"unknown feature group(s) {unknown}; known: {sorted(FEATURE_GROUPS)}")
    keep = np.ones(N_FEATURES, dtype=np.float32)
    for group in groups:
        for name in FEATURE_GROUPS[group]:
            keep[FEATURES.index(name)] = 0.0
    return keep


class EntryTable:
    """Fixed-size slot arrays for resident entries; a slot is reused after its entry leaves. Slot
    numbers, counts and conversation numbers are 32-bit; ticks and times 64-bit."""

    def __init__(self, slots: int, capacity: int) -> None:
        self.slots = slots
        self.capacity = capacity
        self.time_scale = math.log1p(64.0 * max(capacity, 16))
        self.size_scale = math.log1p(max(capacity, 2))
        self.used = np.zeros(slots, dtype=bool)
        self.last_tick = np.zeros(slots, dtype=np.int64)
        self.gap = np.full(slots, NO_GAP, dtype=np.int64)
        self.freq = np.zeros(slots, dtype=np.float32)
        self.freq_epoch = np.zeros(slots, dtype=np.int32)  # sketch resets when `freq` was read
        self.hits = np.zeros(slots, dtype=np.float32)
        self.attention = np.zeros(slots, dtype=np.float32)
        self.has_attention = np.zeros(slots, dtype=bool)
        self.size = np.ones(slots, dtype=np.int32)
        self.inserted_ms = np.zeros(slots, dtype=np.int64)
        self.ttl_ms = np.zeros(slots, dtype=np.int64)
        self.trace = np.full(slots, -1, dtype=np.int32)
        self.depth = np.zeros(slots, dtype=np.int32)
        self.parent = np.full(slots, -1, dtype=np.int32)
        self.children = np.zeros(slots, dtype=np.int32)
        self.cluster = np.full(slots, -1, dtype=np.int64)
        self.distance = np.zeros(slots, dtype=np.float32)
        self.neighbour = np.zeros(slots, dtype=np.float32)
        # The same columns as memoryviews, for one slot at a time: indexing a view reads and writes
        # plain Python numbers, several times cheaper than a numpy scalar (the per-access path).
        self.v = _Views(self)

    def reset_slot(self, s: int) -> None:
        v = self.v
        v.used[s] = False
        v.gap[s] = NO_GAP
        v.freq[s] = 0.0
        v.freq_epoch[s] = 0
        v.hits[s] = 0.0
        v.attention[s] = 0.0
        v.has_attention[s] = False
        v.size[s] = 1
        v.ttl_ms[s] = 0
        v.trace[s] = -1
        v.depth[s] = 0
        v.parent[s] = -1
        v.children[s] = 0
        v.cluster[s] = -1
        v.distance[s] = 0.0
        v.neighbour[s] = 0.0

    def apply_meta(self, s: int, meta: AccessMeta, trace_ids: dict[str, int], now_ms: int) -> None:
        """Record what an access says about slot `s`; `trace_ids` numbers conversations."""
        if meta.attention_heat is not None:
            self.attention[s] = min(max(meta.attention_heat, 0.0), 1.0)
            self.has_attention[s] = True
        if meta.trace_id is not None:
            self.trace[s] = trace_ids.setdefault(meta.trace_id, len(trace_ids))
        if meta.ttl_ms is not None:
            self.ttl_ms[s] = meta.ttl_ms
            self.inserted_ms[s] = now_ms
        if meta.cluster is not None:
            self.cluster[s] = meta.cluster

    def neighbour_keep_alive(
        self,
        idx: np.ndarray,
        raw: np.ndarray,
        clusters: np.ndarray,
        clustered: np.ndarray,
        eff: np.ndarray,
        tau: float,
    ) -> np.ndarray:
        """Each clustered entry inherits cluster heat * exp(-distance / tau) from its cluster's
        hottest member (recorded in `neighbour`); returns `eff` raised to it."""
        ids, inverse = np.unique(clusters[clustered], return_inverse=True)
        hottest = np.zeros(len(ids), dtype=np.float32)
        np.maximum.at(hottest, inverse, raw[clustered])
        keep_alive = hottest[inverse] * np.exp(-self.distance[idx[clustered]] / tau)
        self.neighbour[idx[clustered]] = keep_alive
        eff[clustered] = np.maximum(eff[clustered], keep_alive)
        return eff

    def features_one(
        self, s: int, now_tick: int, now_ms: int, alive: bool, resets: int = 0
    ) -> tuple[float, ...]:
        """`features` for one slot in plain Python (a newcomer's admission duel must be cheap)."""
        ts, v = self.time_scale, self.v
        age = max(now_tick - v.last_tick[s], 0)
        gap = v.gap[s]
        ttl = v.ttl_ms[s]
        ttl_left = min(max(1.0 - (now_ms - v.inserted_ms[s]) / ttl, 0.0), 1.0) if ttl > 0 else 1.0
        return (
            min(math.log1p(age) / ts, 1.0),
            1.0 if gap == NO_GAP else min(math.log1p(max(gap, 0)) / ts, 1.0),
            v.freq[s] / 16.0 / 2.0 ** (resets - v.freq_epoch[s]),
            min(math.log1p(v.hits[s]) / math.log(64.0), 1.0),
            v.attention[s],
            1.0 if v.has_attention[s] else 0.0,
            min(math.log1p(v.size[s]) / self.size_scale, 1.0),
            ttl_left,
            1.0 if alive else 0.0,
            min(math.log1p(v.depth[s]) / math.log(512.0), 1.0),
            min(math.log1p(v.children[s]) / math.log(16.0), 1.0),
            v.neighbour[s],
        )

    def recency_frequency(self, idx: np.ndarray, now_tick: int, resets: int = 0) -> np.ndarray:
        """Just the `recency` and `frequency` columns of `features` (what the fixed prior reads)."""
        out = np.empty((len(idx), 2), dtype=np.float32)
        age = np.maximum(now_tick - self.last_tick[idx], 0)
        out[:, 0] = np.minimum(np.log1p(age) / self.time_scale, 1.0)
        out[:, 1] = self.freq[idx] / 16.0 / np.exp2(resets - self.freq_epoch[idx])
        return out

    def features(
        self, idx: np.ndarray, now_tick: int, now_ms: int, alive: np.ndarray, resets: int = 0
    ) -> np.ndarray:
        """Feature matrix (len(idx), N_FEATURES) for slots `idx`; `alive[i]` says whether the trace
        of slot idx[i] is still open (True when it has none). The frequency read at the last access
        is halved once per sketch reset since (`resets` is the sketch's count), as the sketch ages."""
        out = np.empty((len(idx), N_FEATURES), dtype=np.float32)
        ts = self.time_scale
        age = np.maximum(now_tick - self.last_tick[idx], 0)
        out[:, 0] = np.minimum(np.log1p(age) / ts, 1.0)
        gap = self.gap[idx]
        out[:, 1] = np.where(gap == NO_GAP, 1.0, np.minimum(np.log1p(np.maximum(gap, 0)) / ts, 1.0))
        out[:, 2] = self.freq[idx] / 16.0 / np.exp2(resets - self.freq_epoch[idx])
        out[:, 3] = np.minimum(np.log1p(self.hits[idx]) / math.log(64.0), 1.0)
        out[:, 4] = self.attention[idx]
        out[:, 5] = self.has_attention[idx]
        out[:, 6] = np.minimum(np.log1p(self.size[idx]) / self.size_scale, 1.0)
        ttl = self.ttl_ms[idx]
        lived = now_ms - self.inserted_ms[idx]
        out[:, 7] = np.where(ttl > 0, np.clip(1.0 - lived / np.maximum(ttl, 1), 0.0, 1.0), 1.0)
        out[:, 8] = alive
        out[:, 9] = np.minimum(np.log1p(self.depth[idx]) / math.log(512.0), 1.0)
        out[:, 10] = np.minimum(np.log1p(self.children[idx]) / math.log(16.0), 1.0)
        out[:, 11] = self.neighbour[idx]
        return out


def view(column: np.ndarray) -> Any:
    """A memoryview of `column` (typed loosely: typeshed's views hold ints, these hold floats too)."""
    return column.data


class _Views:
    """Memoryviews over an `EntryTable`'s columns (same memory, same names)."""

    def __init__(self, t: EntryTable) -> None:
        self.used = view(t.used)
        self.last_tick = view(t.last_tick)
        self.gap = view(t.gap)
        self.freq = view(t.freq)
        self.freq_epoch = view(t.freq_epoch)
        self.hits = view(t.hits)
        self.attention = view(t.attention)
        self.has_attention = view(t.has_attention)
        self.size = view(t.size)
        self.inserted_ms = view(t.inserted_ms)
        self.ttl_ms = view(t.ttl_ms)
        self.trace = view(t.trace)
        self.depth = view(t.depth)
        self.parent = view(t.parent)
        self.children = view(t.children)
        self.cluster = view(t.cluster)
        self.distance = view(t.distance)
        self.neighbour = view(t.neighbour)
