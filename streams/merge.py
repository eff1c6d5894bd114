"""Stage 2 of the window pipeline: merges partial panes from every source partition and emits the
windows, and the drift clusters of each shard, once every partition has moved past them.

A stage-2 partition's watermark is the lowest progress over all source partitions. Re-sent partials
overwrite and emitted windows carry deterministic event ids, so a restart repeats at most what
consumers drop as duplicates. Which windows, and how skipped records are noticed: docs/streams.md
("Stage 2: merging panes").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.events import DriftClustered, Event, WindowComputed
from streams.drift import Cluster, DriftParams, WindowKeys, advance_runs, cluster_window
from streams.records import Partial, Progress, TableWrite, parse_table_key, table_key
from streams.windows import (
    HOPPING_10S,
    PANE_MS,
    PANE_RETENTION_MS,
    TUMBLING_1S,
    Group,
    PaneAggregate,
    SlidingKeys,
    group_order,
    merge_all,
    tracks_drift,
    window_computed,
)

MAX_KEYS_PER_DRIFT_EVENT = 1024


@dataclass(slots=True)
class _GroupState:
    partials: dict[int, dict[int, PaneAggregate]] = field(default_factory=dict)
    merged: dict[int, PaneAggregate] = field(default_factory=dict)
    # The merged panes' drift detail as columns (dropped with `merged`).
    columns: dict[int, PaneColumns] = field(default_factory=dict)
    # The last hopping window's key counts, moved pane by pane.
    sliding: SlidingKeys = field(default_factory=SlidingKeys)
    emitted_until: int | None = None
    # Drift: when each key's current run of activity began (persisted as one record per shard).
    runs: dict[str, int] = field(default_factory=dict)
    runs_changed: bool = False


@dataclass(slots=True)
class _MergeState:
    progress: dict[int, int] = field(default_factory=dict)
    partitions_total: int = 0
    groups: dict[Group, _GroupState] = field(default_factory=dict)
    emitted_watermark: int | None = None
    # Every hand-off record before this offset is in the state; None: unknown (a `wm` entry written
    # before offsets were kept). Persisted in the `wm` entry, which is written after the entries of
    # the records before it, so a restored state never claims records whose writes were lost.
    next_offset: int | None = 0


@dataclass(slots=True)
class Emission:
    events: list[Event] = field(default_factory=list)
    writes: list[TableWrite] = field(default_factory=list)

    @property
    def windows(self) -> list[WindowComputed]:
        return [e for e in self.events if isinstance(e, WindowComputed)]


@dataclass(slots=True)
class MergeCounters:
    partials: int = 0
    late_partials: int = 0
    windows: int = 0
    clusters: int = 0


def drift_event_id(shard: str, window_end_ms: int, index: int) -> str:
    return hashlib.sha256(f"drift|{shard}|{window_end_ms}|{index}".encode()).hexdigest()[:32]


def drift_clustered(shard: str, window_end_ms: int, index: int, cluster: Cluster) -> DriftClustered:
    """The event for the `index`-th cluster of a shard's hopping window ending at `window_end_ms`."""
    return DriftClustered(
        event_id=drift_event_id(shard, window_end_ms, index),
        occurred_at_ms=window_end_ms,
        cluster_id=f"{shard}:{window_end_ms}:{index}",
        pattern=cluster.pattern,
        window_start_ms=window_end_ms - HOPPING_10S.size_ms,
        window_end_ms=window_end_ms,
        keys=list(cluster.keys[:MAX_KEYS_PER_DRIFT_EVENT]),
        size=len(cluster.keys),
        duration_ms=cluster.duration_ms,
        variance=cluster.variance,
        service_spread=min(1.0, cluster.service_spread),
        shard=shard,
        eps=cluster.eps,
    )


@dataclass(frozen=True, slots=True)
class PaneColumns:
    """A pane's per-key drift detail as columns, built once per pane (a pane is in ten hopping
    windows): keys in the pane's order, and services as bits of the `ServiceBits` of its merge."""

    generation: int
    keys: list[str]
    count: np.ndarray
    first_ms: np.ndarray
    last_ms: np.ndarray
    depth: np.ndarray
    services: np.ndarray  # int64 bit masks


class ServiceBits:
    """Service name <-> bit, for the union of a key's services across panes as one OR. Calling services
    are few; past 63 distinct names `bits_of` gives None and the caller takes the exact slow path."""

    LIMIT = 63

    def __init__(self) -> None:
        self.generation = -1
        self.reset()

    def reset(self) -> None:
        """Forgets every name (columns of an older generation are stale): for when names came and went,
        as node ids do, and the bits ran out."""
        self.generation += 1
        self.bit: dict[str, int] = {}
        self.names: list[str] = []
        self._sets: dict[int, frozenset[str]] = {0: frozenset()}

    def mask(self, services: set[str]) -> int | None:
        out = 0
        for name in services:
            b = self.bit.get(name)
            if b is None:
                if len(self.names) >= self.LIMIT:
                    return None
                b = self.bit[name] = len(self.names)
                self.names.append(name)
            out |= 1 << b
        return out

    def names_of(self, mask: int) -> frozenset[str]:
        found = self._sets.get(mask)
        if found is None:
            found = self._sets[mask] = frozenset(n for i, n in enumerate(self.names) if mask >> i & 1)
        return found


def pane_columns(pane: PaneAggregate, bits: ServiceBits) -> PaneColumns | None:
    activity = pane.activity or {}
    acts = list(activity.values())
    masks = [bits.mask(a.services) for a in acts]
    if any(m is None for m in masks):
        return None
    return PaneColumns(
        generation=bits.generation,
        keys=list(activity),
        count=np.fromiter((a.count for a in acts), dtype=np.int64, count=len(acts)),
        first_ms=np.fromiter((a.first_ms for a in acts), dtype=np.int64, count=len(acts)),
        last_ms=np.fromiter((a.last_ms for a in acts), dtype=np.int64, count=len(acts)),
        depth=np.fromiter((a.max_depth for a in acts), dtype=np.int64, count=len(acts)),
        services=np.array(masks, dtype=np.int64),
    )


def window_keys(
    panes: list[PaneAggregate | None],
    columns: list[PaneColumns | None] | None = None,
    bits: ServiceBits | None = None,
) -> tuple[WindowKeys, dict[str, int]]:
    """Per-key drift inputs for one hopping window (panes oldest first, None where empty), and each
    key's first access in it. `active_since_ms` is left at that first access; see `with_runs`.
    `columns` (each pane's `pane_columns` under `bits`) takes the vectorised path: the same result,
    rows in the same order (each key's first appearance, oldest pane first)."""
    if columns is None or bits is None:
        return _window_keys_slowly(panes)
    present = [(i, c) for i, c in enumerate(columns) if c is not None]
    all_keys: list[str] = []
    for _, c in present:
        all_keys += c.keys
    order = dict.fromkeys(all_keys)  # first appearance, in pane order: the slow path's row order
    index = {key: row for row, key in enumerate(order)}
    rows = np.fromiter(map(index.__getitem__, all_keys), dtype=np.int64, count=len(all_keys))
    cols = np.concatenate([np.full(len(c.keys), i, dtype=np.int64) for i, c in present]) if present else rows
    n = len(index)

    def stacked(name: str) -> np.ndarray:
        return np.concatenate([getattr(c, name) for _, c in present]) if present else np.zeros(0, np.int64)

    per_pane = np.zeros((n, len(panes)), dtype=np.int64)
    np.add.at(per_pane, (rows, cols), stacked("count"))
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, rows, stacked("first_ms"))
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, rows, stacked("last_ms"))
    depth = np.zeros(n, dtype=np.int64)
    np.maximum.at(depth, rows, stacked("depth"))
    masks = np.zeros(n, dtype=np.int64)
    np.bitwise_or.at(masks, rows, stacked("services"))
    keys = WindowKeys(
        keys=list(index),
        count=per_pane.sum(axis=1),
        last_ms=last,
        depth=depth,
        active_since_ms=first,
        pane_counts=per_pane,
        services=[bits.names_of(m) for m in masks.tolist()],
    )
    return keys, dict(zip(index, first.tolist(), strict=True))


def _window_keys_slowly(panes: list[PaneAggregate | None]) -> tuple[WindowKeys, dict[str, int]]:
    """Per-key drift inputs for one hopping window (panes oldest first, None where empty), and each
    key's first access in it. `active_since_ms` is left at that first access; see `with_runs`."""
    index: dict[str, int] = {}
    first: list[int] = []
    last: list[int] = []
    depth: list[int] = []
    services: list[set[str]] = []
    rows: list[int] = []
    cols: list[int] = []
    counts: list[int] = []
    for i, pane in enumerate(panes):
        if pane is None or pane.activity is None:
            continue
        for key, act in pane.activity.items():
            r = index.get(key)
            if r is None:
                r = index[key] = len(first)
                first.append(act.first_ms)
                last.append(act.last_ms)
                depth.append(act.max_depth)
                services.append(set(act.services))
            else:
                first[r] = min(first[r], act.first_ms)
                last[r] = max(last[r], act.last_ms)
                depth[r] = max(depth[r], act.max_depth)
                services[r] |= act.services
            rows.append(r)
            cols.append(i)
            counts.append(act.count)
    per_pane = np.zeros((len(first), len(panes)), dtype=np.int64)
    np.add.at(per_pane, (np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)), counts)
    keys = WindowKeys(
        keys=list(index),
        count=per_pane.sum(axis=1),
        last_ms=np.array(last, dtype=np.int64),
        depth=np.array(depth, dtype=np.int64),
        active_since_ms=np.array(first, dtype=np.int64),
        pane_counts=per_pane,
        services=[frozenset(s) for s in services],
    )
    return keys, dict(zip(index, first, strict=True))


def with_runs(keys: WindowKeys, runs: dict[str, int]) -> WindowKeys:
    keys.active_since_ms = np.array([runs[k] for k in keys.keys], dtype=np.int64)
    return keys


class Merge:
    """Stage-2 state of the hand-off partitions this worker owns; no I/O."""

    def __init__(self, drift: DriftParams | None = None, *, drift_enabled: bool = True) -> None:
        self.drift = drift or DriftParams()
        self.drift_enabled = drift_enabled
        self.bits = ServiceBits()
        self.counters = MergeCounters()
        self._parts: dict[int, _MergeState] = {}

    def owns(self, partition: int) -> bool:
        return partition in self._parts

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def assign(self, partition: int) -> None:
        self._parts.setdefault(partition, _MergeState())

    def revoke(self, partition: int) -> None:
        self._parts.pop(partition, None)

    def load(self, partition: int, items: Iterable[tuple[str, Any]]) -> None:
        state = _MergeState()
        for key, value in items:
            parts = parse_table_key(key)
            if len(parts) < 2 or parts[1] != partition:
                continue
            kind = parts[0]
            if kind == "wm":
                state.progress.update({int(p): int(c) for p, c in value["c"].items()})
                state.partitions_total = max(state.partitions_total, int(value["n"]))
                state.next_offset = int(value["o"]) if "o" in value else None
            elif kind == "part":
                group = self._group(state, (parts[2], parts[3]))
                group.partials.setdefault(int(parts[4]), {})[int(parts[5])] = PaneAggregate.from_json(value)
            elif kind == "emit":
                self._group(state, (parts[2], parts[3])).emitted_until = int(value)
            elif kind == "runs":
                self._group(state, (parts[2], None)).runs = {str(k): int(v) for k, v in value.items()}
        self._parts[partition] = state

    @staticmethod
    def _group(state: _MergeState, group: tuple[Any, Any]) -> _GroupState:
        key: Group = (str(group[0]), None if group[1] is None else str(group[1]))
        found = state.groups.get(key)
        if found is None:
            found = state.groups[key] = _GroupState()
        return found

    def _state(self, partition: int) -> _MergeState:
        state = self._parts.get(partition)
        if state is None:
            state = self._parts[partition] = _MergeState()
        return state

    # --- hand-off records --------------------------------------------------------------------

    def applied(self, partition: int, offset: int) -> bool:
        """Is the hand-off record at `offset` already in the state (re-delivered from an older
        commit)?"""
        next_offset = self._state(partition).next_offset
        return next_offset is not None and offset < next_offset

    def missed(self, partition: int, offset: int) -> tuple[int, int] | None:
        """The offsets [start, offset) not applied yet when the record at `offset` arrives: records
        the consumer skipped, which must be applied first; None when there are none."""
        next_offset = self._state(partition).next_offset
        if next_offset is None or offset <= next_offset:
            return None
        return next_offset, offset

    def _advance(self, state: _MergeState, offset: int | None) -> None:
        if offset is not None:
            state.next_offset = max(state.next_offset or 0, offset + 1)

    def apply_partial(
        self, partition: int, partial: Partial, offset: int | None = None, as_json: Any | None = None
    ) -> list[TableWrite]:
        """Holds the partial until its windows are emitted; `as_json` is its aggregate's `to_json()`
        when the caller already has it (the hand-off record), saved as it is."""
        state = self._state(partition)
        self._advance(state, offset)
        group = self._group(state, partial.group)
        start = partial.pane_start_ms
        if group.emitted_until is not None and start + PANE_MS <= group.emitted_until:
            self.counters.late_partials += 1
            return []
        group.partials.setdefault(start, {})[partial.source_partition] = partial.aggregate
        group.merged.pop(start, None)
        group.columns.pop(start, None)
        self.counters.partials += 1
        shard, model = partial.group
        key = table_key("part", partition, shard, model, start, partial.source_partition)
        return [TableWrite(partition, key, partial.aggregate.to_json() if as_json is None else as_json)]

    def apply_progress(
        self, partition: int, progress: Progress, offset: int | None = None
    ) -> list[TableWrite]:
        """The `wm` write when the watermark inputs moved; write it after the emission's writes
        (see `next_offset`)."""
        state = self._state(partition)
        self._advance(state, offset)
        changed = progress.partitions > state.partitions_total
        state.partitions_total = max(state.partitions_total, progress.partitions)
        for source, closed in progress.closed_before_ms.items():
            if closed > state.progress.get(source, -1):
                state.progress[source] = closed
                changed = True
        if not changed:
            return []
        value: dict[str, Any] = {
            "n": state.partitions_total,
            "c": {str(p): c for p, c in sorted(state.progress.items())},
        }
        if state.next_offset is not None:
            value["o"] = state.next_offset
        return [TableWrite(partition, table_key("wm", partition), value)]

    def watermark(self, partition: int) -> int | None:
        state = self._parts.get(partition)
        if state is None or state.partitions_total == 0:
            return None
        marks = [state.progress.get(p) for p in range(state.partitions_total)]
        if any(m is None for m in marks):
            return None
        return min(m for m in marks if m is not None)

    # --- emission ----------------------------------------------------------------------------

    def emit(self, partition: int) -> Emission:
        """Every window of this partition's groups that the watermark has completed."""
        out = Emission()
        watermark = self.watermark(partition)
        if watermark is None:
            return out
        state = self._parts[partition]
        if state.emitted_watermark is not None and watermark <= state.emitted_watermark:
            return out
        state.emitted_watermark = watermark
        for group in sorted(state.groups, key=group_order):
            self._emit_group(partition, group, state.groups[group], watermark, out)
        self.counters.windows += sum(1 for e in out.events if isinstance(e, WindowComputed))
        self.counters.clusters += sum(1 for e in out.events if isinstance(e, DriftClustered))
        return out

    def _emit_group(
        self, partition: int, group: Group, gs: _GroupState, watermark: int, out: Emission
    ) -> None:
        if not gs.partials and not gs.runs:
            return  # nothing to emit; `emitted_until` moves on with the next data
        if gs.emitted_until is not None:
            end = gs.emitted_until + PANE_MS
        else:
            end = min(gs.partials) + PANE_MS
        last_done = gs.emitted_until
        drift = self.drift_enabled and tracks_drift(group)
        complete = watermark - watermark % PANE_MS
        while end <= watermark:
            hop = [s for s in HOPPING_10S.panes(end) if s in gs.partials]
            if not hop:
                # Every window ending up to the next pane with data (or the watermark) is empty.
                if drift and gs.runs:
                    gs.runs = {}
                    gs.runs_changed = True
                upcoming = min((s for s in gs.partials if s >= end), default=complete)
                last_done = min(upcoming, complete)
                end = last_done + PANE_MS
                continue
            tumbling_start = end - PANE_MS
            if tumbling_start in gs.partials:
                tumbling = self._merged(gs, tumbling_start)
                out.events.append(window_computed(TUMBLING_1S, group, tumbling_start, tumbling))
            starts = HOPPING_10S.panes(end)
            panes = [self._merged(gs, s) if s in gs.partials else None for s in starts]
            hopping = merge_all((p for p in panes if p is not None), activity=False, keys=False)
            in_window = {s: p.keys for s, p in zip(starts, panes, strict=True) if p is not None}
            hopping.keys = gs.sliding.slide(in_window)
            out.events.append(window_computed(HOPPING_10S, group, end - HOPPING_10S.size_ms, hopping))
            if drift:
                self._drift(partition, group, gs, panes, end, out)
            last_done = end
            end += PANE_MS
        if gs.runs_changed:
            gs.runs_changed = False
            key = table_key("runs", partition, group[0])
            out.writes.append(TableWrite(partition, key, dict(sorted(gs.runs.items())) or None))
        if last_done is None or last_done == gs.emitted_until:
            return
        gs.emitted_until = last_done
        out.writes.append(TableWrite(partition, table_key("emit", partition, group[0], group[1]), last_done))
        for start in sorted(s for s in gs.partials if s + PANE_RETENTION_MS <= last_done):
            for source in sorted(gs.partials.pop(start)):
                key = table_key("part", partition, group[0], group[1], start, source)
                out.writes.append(TableWrite(partition, key, None))
            gs.merged.pop(start, None)
            gs.columns.pop(start, None)

    @staticmethod
    def _merged(gs: _GroupState, start: int) -> PaneAggregate:
        merged = gs.merged.get(start)
        if merged is None:
            merged = gs.merged[start] = merge_all(gs.partials[start][p] for p in sorted(gs.partials[start]))
        return merged

    def _columns(
        self, gs: _GroupState, end: int, panes: list[PaneAggregate | None]
    ) -> list[PaneColumns | None] | None:
        """The window's panes as columns (cached per pane); None when even fresh bits cannot name every
        service of the window (the slow path then)."""
        for _ in range(2):
            out: list[PaneColumns | None] = []
            for start, pane in zip(HOPPING_10S.panes(end), panes, strict=True):
                if pane is None or pane.activity is None:
                    out.append(None)
                    continue
                cached = gs.columns.get(start)
                if cached is None or cached.generation != self.bits.generation:
                    cached = pane_columns(pane, self.bits)
                    if cached is None:
                        break
                    gs.columns[start] = cached
                out.append(cached)
            else:
                return out
            self.bits.reset()
        return None

    def _drift(
        self,
        partition: int,
        group: Group,
        gs: _GroupState,
        panes: list[PaneAggregate | None],
        end: int,
        out: Emission,
    ) -> None:
        keys, first = window_keys(panes, self._columns(gs, end, panes), self.bits)
        runs, started, ended = advance_runs(gs.runs, first)
        gs.runs = runs
        gs.runs_changed |= bool(started or ended)
        keys = with_runs(keys, runs)
        for index, cluster in enumerate(cluster_window(keys, end, self.drift)):
            out.events.append(drift_clustered(group[0], end, index, cluster))
