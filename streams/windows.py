"""Event-time windows over cache accesses: window boundaries, the mergeable per-pane aggregate and
the statistics of a window (docs/design.md §2.3, §3.3).

Time is `occurred_at_ms`, never the clock of the machine that counts, so a replay and the live
stream agree. Everything is built from 1 s *panes* aligned to the epoch: the tumbling 1 s window is
one pane; the hopping 10 s window advancing by 1 s that ends at `e` is the ten panes before `e`.
A pane aggregate merges by addition, so partial panes (one per source partition) and panes of a
hopping window combine in any order with the same counts.

Groups: every access counts towards its shard and towards all shards (`*`), each once without a
model and once with its model when it has one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from schemas.events import CacheAccessed, WindowComputed
from streams.entropy import shannon_entropy_bits
from streams.penetration import (
    LayerCounts,
    added_latency_by_layer,
    is_penetration,
    penetration_by_layer,
)
from streams.spikes import SPIKE_RTT_MS

PANE_MS = 1_000
ALL_SHARDS = "*"
UNSHARDED = "unsharded"

WindowName = Literal["tumbling_1s", "hopping_10s"]


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """Windows of `size_ms` starting every `step_ms`, aligned to multiples of `step_ms`."""

    name: WindowName
    size_ms: int
    step_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.step_ms <= 0 or self.size_ms % PANE_MS or self.step_ms % PANE_MS:
            raise ValueError("window size and step must be positive multiples of the pane")

    def windows_for(self, ts_ms: int) -> list[tuple[int, int]]:
        """Every [start, end) window that contains `ts_ms`, earliest first."""
        last_start = ts_ms - ts_ms % self.step_ms
        starts = range(last_start, ts_ms - self.size_ms, -self.step_ms)
        return sorted((s, s + self.size_ms) for s in starts if s >= 0)

    def window_ending(self, end_ms: int) -> tuple[int, int]:
        return (end_ms - self.size_ms, end_ms)

    def panes(self, end_ms: int) -> range:
        """Start times of the panes that make up the window ending at `end_ms`."""
        return range(end_ms - self.size_ms, end_ms, PANE_MS)


TUMBLING_1S = WindowSpec("tumbling_1s", 1_000, 1_000)
HOPPING_10S = WindowSpec("hopping_10s", 10_000, 1_000)
WINDOWS: tuple[WindowSpec, ...] = (TUMBLING_1S, HOPPING_10S)
# How far back a pane can still be needed: the longest window.
PANE_RETENTION_MS = max(w.size_ms for w in WINDOWS)


def pane_start(ts_ms: int) -> int:
    return ts_ms - ts_ms % PANE_MS


# --- groups -------------------------------------------------------------------------------------

Group = tuple[str, str | None]  # (shard or "*", model or None)


def shard_of(access: CacheAccessed) -> str:
    return access.shard if access.shard else UNSHARDED


def groups_for(access: CacheAccessed) -> list[Group]:
    shard = shard_of(access)
    groups: list[Group] = [(shard, None), (ALL_SHARDS, None)]
    if access.model:
        groups += [(shard, access.model), (ALL_SHARDS, access.model)]
    return groups


def tracks_drift(group: Group) -> bool:
    """Drift is clustered per shard over keys, without splitting by model."""
    return group[1] is None and group[0] != ALL_SHARDS


def group_order(group: Group) -> tuple[str, str]:
    return (group[0], group[1] or "")


def group_label(group: Group) -> str:
    return f"{group[0]}/{group[1] or '*'}"


# --- the aggregate ------------------------------------------------------------------------------


@dataclass(slots=True)
class KeyActivity:
    """One key inside one pane, for drift features (docs/design.md §2.4)."""

    count: int = 0
    first_ms: int = 0
    last_ms: int = 0
    max_depth: int = 0
    services: set[str] = field(default_factory=set)

    def add(self, ts_ms: int, depth: int, service: str | None) -> None:
        if self.count == 0 or ts_ms < self.first_ms:
            self.first_ms = ts_ms
        self.last_ms = max(self.last_ms, ts_ms)
        self.count += 1
        self.max_depth = max(self.max_depth, depth)
        if service:
            self.services.add(service)

    def merge(self, other: KeyActivity) -> None:
        if other.count == 0:
            return
        if self.count == 0 or other.first_ms < self.first_ms:
            self.first_ms = other.first_ms
        self.last_ms = max(self.last_ms, other.last_ms)
        self.count += other.count
        self.max_depth = max(self.max_depth, other.max_depth)
        self.services |= other.services

    def to_json(self) -> list[Any]:
        services = self.services
        # Most keys have one service: no sort to call for that.
        return [
            self.count,
            self.first_ms,
            self.last_ms,
            self.max_depth,
            sorted(services) if len(services) > 1 else list(services),
        ]


@dataclass(slots=True)
class PaneAggregate:
    """Everything a window needs from the accesses of one group in one pane (or several panes,
    once merged). Exact: counts and the miss latencies themselves, not sketches."""

    requests: int = 0
    hits: int = 0
    penetrated: int = 0
    spikes: int = 0
    keys: dict[str, int] = field(default_factory=dict)
    # tier -> [lookups, hits]
    tiers: dict[str, list[int]] = field(default_factory=dict)
    layers: dict[str, LayerCounts] = field(default_factory=dict)
    miss_latencies_ms: list[float] = field(default_factory=list)
    # Per key detail, only for groups that feed drift clustering.
    activity: dict[str, KeyActivity] | None = None

    @classmethod
    def for_group(cls, group: Group) -> PaneAggregate:
        return cls(activity={} if tracks_drift(group) else None)

    def add(self, access: CacheAccessed, spike_rtt_ms: float = SPIKE_RTT_MS) -> None:
        self.requests += 1
        key = access.key
        self.keys[key] = self.keys.get(key, 0) + 1
        if access.hit:
            self.hits += 1
        else:
            self.miss_latencies_ms.append(access.latency_ms)
        if access.tier is not None:
            tier = self.tiers.setdefault(access.tier, [0, 0])
            tier[0] += 1
            tier[1] += access.hit
        if access.layer is not None:
            layer = self.layers.get(access.layer)
            if layer is None:
                layer = self.layers[access.layer] = LayerCounts()
            layer.add(access.hit, access.latency_ms)
        if is_penetration(access):
            self.penetrated += 1
        if access.latency_ms > spike_rtt_ms:
            self.spikes += 1
        if self.activity is not None:
            act = self.activity.get(key)
            if act is None:
                act = self.activity[key] = KeyActivity()
            act.add(access.occurred_at_ms, access.call_depth or 0, access.service or access.node_id)

    def merge(self, other: PaneAggregate, activity: bool = True, keys: bool = True) -> PaneAggregate:
        """Adds `other` in; `activity=False` leaves the per-key drift detail out (window
        statistics do not need it), `keys=False` the key counts (for a caller that keeps them).

        `other`'s `KeyActivity` objects are taken over as they are where this aggregate has no such
        key (a key counts in one source partition only, so merging a pane's partials is mostly a
        union), and never changed: where both have a key, a new one holds the sum."""
        self.requests += other.requests
        self.hits += other.hits
        self.penetrated += other.penetrated
        self.spikes += other.spikes
        if keys:
            key_counts = self.keys
            if key_counts.keys().isdisjoint(other.keys):
                key_counts.update(other.keys)
            else:
                for key, n in other.keys.items():
                    key_counts[key] = key_counts.get(key, 0) + n
        for name, (lookups, hits) in other.tiers.items():
            tier = self.tiers.setdefault(name, [0, 0])
            tier[0] += lookups
            tier[1] += hits
        for name, counts in other.layers.items():
            self.layers.setdefault(name, LayerCounts()).merge(counts)
        self.miss_latencies_ms.extend(other.miss_latencies_ms)
        if activity and other.activity is not None:
            if self.activity is None:
                self.activity = {}
            mine_all = self.activity
            if mine_all.keys().isdisjoint(other.activity):
                mine_all.update(other.activity)
            else:
                for key, act in other.activity.items():
                    mine = mine_all.get(key)
                    if mine is None:
                        mine_all[key] = act
                    else:
                        total = mine_all[key] = KeyActivity()
                        total.merge(mine)
                        total.merge(act)
        return self

    def copy(self) -> PaneAggregate:
        return PaneAggregate.from_json(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """A snapshot: nothing in it is shared with the live aggregate."""
        doc: dict[str, Any] = {
            "r": self.requests,
            "h": self.hits,
            "p": self.penetrated,
            "s": self.spikes,
            "k": dict(self.keys),
            "t": {name: list(counts) for name, counts in self.tiers.items()},
            "l": {name: c.to_json() for name, c in self.layers.items()},
            "m": list(self.miss_latencies_ms),
        }
        if self.activity is not None:
            doc["a"] = {key: act.to_json() for key, act in self.activity.items()}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PaneAggregate:
        activity = doc.get("a")
        return cls(
            requests=int(doc["r"]),
            hits=int(doc["h"]),
            penetrated=int(doc["p"]),
            spikes=int(doc["s"]),
            # JSON object keys are strings and `to_json` writes the counts as integers: copied as
            # they are (this runs for every key of every hand-off record).
            keys=dict(doc["k"]),
            tiers={str(k): [int(v[0]), int(v[1])] for k, v in doc["t"].items()},
            layers={str(k): LayerCounts.from_json(v) for k, v in doc["l"].items()},
            miss_latencies_ms=list(map(float, doc["m"])),
            activity=None if activity is None else _activity_from_json(activity),
        )


def _activity_from_json(raw: Mapping[str, list[Any]]) -> dict[str, KeyActivity]:
    """The per-key activity as `KeyActivity.to_json` wrote it, key by key (one comprehension: this runs
    for every key of every hand-off record)."""
    return {key: KeyActivity(c, f, la, d, set(s)) for key, (c, f, la, d, s) in raw.items()}


def merge_all(aggregates: Iterable[PaneAggregate], activity: bool = True, keys: bool = True) -> PaneAggregate:
    total = PaneAggregate()
    for agg in aggregates:
        total.merge(agg, activity, keys)
    return total


class SlidingKeys:
    """The key counts of a sliding window, kept as panes enter and leave it: each pane's counts are
    added once and subtracted once, instead of merging every pane of every window (a 10 s window
    hopping by 1 s holds each pane ten times). Exact: integer counts, a key leaves at zero."""

    __slots__ = ("_panes", "counts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        # start -> the very dict that was added (subtracted as it was, even if the pane is rebuilt)
        self._panes: dict[int, dict[str, int]] = {}

    def slide(self, panes: Mapping[int, dict[str, int]]) -> dict[str, int]:
        """Moves the window onto exactly `panes` (start -> key counts); returns the counts (owned by
        this object: read, do not keep)."""
        counts = self.counts
        for start in [s for s in self._panes if s not in panes or panes[s] is not self._panes[s]]:
            for key, n in self._panes.pop(start).items():
                left = counts[key] - n
                if left:
                    counts[key] = left
                else:
                    del counts[key]
        for start, keys in panes.items():
            if start not in self._panes:
                self._panes[start] = keys
                for key, n in keys.items():
                    counts[key] = counts.get(key, 0) + n
        return counts


# --- statistics ---------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in (0, 100]) of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


# Below this many values a sort is as cheap as a partition (and needs no array).
_PARTITION_FROM = 64


def percentiles(values: list[float], qs: tuple[float, ...]) -> list[float | None]:
    """Nearest-rank percentiles of unsorted `values`, as `percentile` gives them on the sorted list:
    selected with a partial sort (O(n)) instead of sorting every miss latency of a 10 s window each
    time it is emitted (that sort was 4% of a loaded worker's CPU)."""
    n = len(values)
    if n == 0:
        return [None] * len(qs)
    ranks = [max(1, math.ceil(q / 100.0 * n)) - 1 for q in qs]
    if n < _PARTITION_FROM:
        ordered = sorted(values)
        return [ordered[r] for r in ranks]
    selected = np.partition(np.fromiter(values, dtype=np.float64, count=n), sorted(set(ranks)))
    return [float(selected[r]) for r in ranks]


def window_event_id(spec: WindowSpec, group: Group, start_ms: int) -> str:
    """Deterministic, so a window re-emitted after a restart is dropped as a duplicate downstream."""
    raw = f"stream.window_computed|{spec.name}|{group[0]}|{group[1] or ''}|{start_ms}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def window_computed(spec: WindowSpec, group: Group, start_ms: int, agg: PaneAggregate) -> WindowComputed:
    """The `WindowComputed` event for one window of one group."""
    end_ms = start_ms + spec.size_ms
    miss_p50, miss_p95 = percentiles(agg.miss_latencies_ms, (50, 95))
    return WindowComputed(
        event_id=window_event_id(spec, group, start_ms),
        occurred_at_ms=end_ms,
        shard=group[0],
        model=group[1],
        window=spec.name,
        window_start_ms=start_ms,
        window_end_ms=end_ms,
        requests=agg.requests,
        qps=agg.requests * 1000.0 / spec.size_ms,
        entropy_bits=shannon_entropy_bits(agg.keys.values()),
        hit_rate=agg.hits / agg.requests if agg.requests else 0.0,
        hit_rate_by_tier={t: (h / n if n else 0.0) for t, (n, h) in sorted(agg.tiers.items())},
        penetration_by_layer=penetration_by_layer(agg.layers),
        added_latency_ms_by_layer=added_latency_by_layer(agg.layers),
        miss_latency_ms_p50=miss_p50,
        miss_latency_ms_p95=miss_p95,
        distinct_keys=len(agg.keys),
        penetrated=agg.penetrated,
        latency_spikes=agg.spikes,
        hits=agg.hits,
    )
