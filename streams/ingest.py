"""Stage 1 of the window pipeline: partial panes per source partition, and their watermarks.

Each source partition of `cache.access.v1` is aggregated on its own, in event time, into 1 s panes per
group, closed once the partition's watermark (its newest event time minus `lateness_ms`) passes their
end; an idle partition (`idle_ms`) follows the others. A record is acknowledged only once every pane it
counts in has been closed and handed on, so recovery is exact under at-least-once delivery.
How: docs/streams.md ("Stage 1: partial panes").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.events import MAX_ACCESS_BATCH, CacheAccessed, Event, KvBlockStored, RequestPenetrated
from streams.penetration import is_penetration
from streams.records import Partial, Progress, TableWrite, parse_table_key, table_key
from streams.spikes import SPIKE_RTT_MS, SpikeDetector
from streams.windows import PANE_MS, Group, PaneAggregate, groups_for, pane_start, shard_of

# Positions per record: an event's position is its record's offset times this, plus its index in the
# record (0 for a single event), so positions are in offset order and distinct within a partition.
RECORD_SLOTS = 1 << (MAX_ACCESS_BATCH - 1).bit_length()


def position(offset: int, index: int = 0) -> int:
    return offset * RECORD_SLOTS + index


@dataclass(slots=True)
class _Pane:
    aggregate: PaneAggregate


@dataclass(slots=True)
class _PartitionState:
    panes: dict[tuple[Group, int], _Pane] = field(default_factory=dict)
    # Per open pane start: the positions applied to it (dropped with the pane when it closes).
    offsets: dict[int, set[int]] = field(default_factory=dict)
    max_event_ms: int = -1
    closed_before_ms: int = 0
    applied_offset: int = -1
    # Wall time of the last event applied, or of the load (`Ingest.load`): a partition is quiet,
    # hence may turn idle, only `idle_ms` after either. None: quiet from the start.
    last_event_wall_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Closing:
    """What `close()` decided: send `partials` then `progress`; once the broker has them, apply
    `writes` (the partitions' new progress); then acknowledge the records of the closed panes."""

    partials: list[Partial]
    progress: Progress | None
    writes: list[TableWrite]


@dataclass(slots=True)
class IngestCounters:
    applied: int = 0
    replayed: int = 0
    late: int = 0
    warm_events: int = 0


def _progress_key(partition: int) -> str:
    return table_key("progress", partition)


def penetration_event(access: CacheAccessed) -> RequestPenetrated:
    return RequestPenetrated(
        event_id=hashlib.sha256(f"penetrated|{access.event_id}".encode()).hexdigest()[:32],
        occurred_at_ms=access.occurred_at_ms,
        shard=shard_of(access),
        key=access.key,
        model=access.model,
        trace_id=access.trace_id,
        latency_ms=access.latency_ms,
    )


class Ingest:
    """Stage-1 state of the partitions this worker owns; no I/O, the clock passed in."""

    def __init__(
        self,
        *,
        lateness_ms: int = 250,
        idle_ms: int = 1_000,
        spike_rtt_ms: float = SPIKE_RTT_MS,
        spikes: SpikeDetector | None = None,
    ) -> None:
        self.lateness_ms = lateness_ms
        self.idle_ms = idle_ms
        self.spike_rtt_ms = spike_rtt_ms
        self.spikes = spikes or SpikeDetector(spike_rtt_ms)
        self.counters = IngestCounters()
        self._parts: dict[int, _PartitionState] = {}
        # The worker's event clock: the newest event time seen and the wall time it was seen at.
        self._clock: tuple[int, int] | None = None

    # --- ownership ---------------------------------------------------------------------------

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def owns(self, partition: int) -> bool:
        return partition in self._parts

    def assign(self, partition: int) -> None:
        self._parts.setdefault(partition, _PartitionState())

    def revoke(self, partition: int) -> None:
        self._parts.pop(partition, None)

    def load(self, partition: int, items: Iterable[tuple[str, Any]], now_wall_ms: int | None = None) -> None:
        """Rebuilds one partition from its table entry (after recovery): where it stands. With
        `now_wall_ms` (the worker does) it counts as active then: a partition that has not delivered
        a record yet is not taken for idle until `idle_ms` later. Otherwise a fetch that came back
        empty just before the partition's first records were produced made it look consumed to its
        end, its watermark followed the others past panes its records were still to fill, and those
        records were late: lost (a kill test lost 3 of 6 partitions' first panes so)."""
        state = _PartitionState(last_event_wall_ms=now_wall_ms)
        for key, value in items:
            parts = parse_table_key(key)
            if parts[0] == "progress" and parts[1] == partition:
                state.max_event_ms = int(value["max"])
                state.closed_before_ms = int(value["closed"])
                # The table keeps the record's offset: every event of that record was applied.
                state.applied_offset = position(int(value["off"]), RECORD_SLOTS - 1)
        self._parts[partition] = state

    # --- events ------------------------------------------------------------------------------

    def apply(self, partition: int, offset: int, event: Event, wall_ms: int, index: int = 0) -> list[Event]:
        """Applies one event, the `index`-th of the record at `offset`; returns the events to publish
        right away (penetration, spikes)."""
        if isinstance(event, KvBlockStored):
            self.spikes.warmed(event.block_hash, event.occurred_at_ms)
            self.counters.warm_events += 1
            return []
        if not isinstance(event, CacheAccessed):
            return []
        state = self._parts.get(partition)
        if state is None:
            state = self._parts[partition] = _PartitionState()
        ts = event.occurred_at_ms
        state.last_event_wall_ms = wall_ms
        if self._clock is None or ts > self._clock[0]:
            self._clock = (ts, wall_ms)
        out: list[Event] = []
        if is_penetration(event):
            out.append(penetration_event(event))
        spike = self.spikes.observe(event, shard_of(event))
        if spike is not None:
            out.append(spike.event(event.event_id))

        start = pane_start(ts)
        offset = position(offset, index)
        if start < state.closed_before_ms:
            if offset <= state.applied_offset:
                self.counters.replayed += 1
            else:
                self.counters.late += 1
            return out
        applied = state.offsets.setdefault(start, set())
        if offset in applied:
            self.counters.replayed += 1
        else:
            applied.add(offset)
            for group in groups_for(event):
                slot = (group, start)
                pane = state.panes.get(slot)
                if pane is None:
                    pane = state.panes[slot] = _Pane(PaneAggregate.for_group(group))
                pane.aggregate.add(event, self.spike_rtt_ms)
            self.counters.applied += 1
        if ts > state.max_event_ms:
            state.max_event_ms = ts
        if offset > state.applied_offset:
            state.applied_offset = offset
        return out

    # --- closing ----------------------------------------------------------------------------

    @staticmethod
    def _progress_value(state: _PartitionState) -> dict[str, int]:
        off = state.applied_offset // RECORD_SLOTS if state.applied_offset >= 0 else -1
        return {"max": state.max_event_ms, "closed": state.closed_before_ms, "off": off}

    def watermarks(self, now_wall_ms: int, caught_up: Mapping[int, bool]) -> dict[int, int]:
        """Each owned partition's watermark: its newest event time minus the lateness. An idle one
        (consumed to its end and quiet for `idle_ms`) follows the slowest active partition, or,
        when every partition is idle, the worker's event clock (the newest event time seen plus
        the wall time since)."""
        own: dict[int, int | None] = {}
        idle: set[int] = set()
        for p, state in self._parts.items():
            own[p] = state.max_event_ms - self.lateness_ms if state.max_event_ms >= 0 else None
            last = state.last_event_wall_ms
            quiet = last is None or now_wall_ms - last >= self.idle_ms
            if caught_up.get(p, False) and quiet:
                idle.add(p)
        active = [wm for p, wm in own.items() if p not in idle]
        follow: int | None
        if active:
            follow = None if any(wm is None for wm in active) else min(wm for wm in active if wm is not None)
        elif self._clock is not None:
            event_ms, seen_wall_ms = self._clock
            follow = event_ms + max(0, now_wall_ms - seen_wall_ms) - self.lateness_ms
        else:
            follow = None
        out: dict[int, int] = {}
        for p, wm in own.items():
            if p in idle and follow is not None:
                wm = follow if wm is None else max(wm, follow)
            if wm is not None:
                out[p] = wm
        return out

    def close(self, now_wall_ms: int, caught_up: Mapping[int, bool], partitions_total: int) -> Closing:
        """Closes every pane the watermarks have passed. The in-memory state moves on at once (a
        record for a closed pane is late from now); the table follows via `Closing.writes`."""
        partials: list[Partial] = []
        advanced: dict[int, int] = {}
        progress_writes: list[TableWrite] = []
        marks = self.watermarks(now_wall_ms, caught_up)
        for p in sorted(self._parts):
            state = self._parts[p]
            wm = marks.get(p)
            if wm is None or wm < 0:
                continue
            closed_before = wm - wm % PANE_MS
            if closed_before <= state.closed_before_ms:
                continue
            for slot in sorted(
                (s for s in state.panes if s[1] < closed_before), key=lambda s: (s[1], s[0][0], s[0][1] or "")
            ):
                pane = state.panes.pop(slot)
                partials.append(Partial(p, slot[0], slot[1], pane.aggregate))
            for start in [s for s in state.offsets if s < closed_before]:
                del state.offsets[start]
            state.closed_before_ms = closed_before
            advanced[p] = closed_before
            progress_writes.append(TableWrite(p, _progress_key(p), self._progress_value(state)))
        progress = Progress(partitions_total, advanced) if advanced else None
        return Closing(partials, progress, progress_writes)

    def progress(self, partitions_total: int) -> Progress | None:
        """Where every owned partition stands (re-sent after a restart, so stage 2 need not wait
        for the next pane boundary)."""
        marks = {p: s.closed_before_ms for p, s in self._parts.items() if s.closed_before_ms > 0}
        return Progress(partitions_total, marks) if marks else None

    def open_panes(self) -> int:
        return sum(len(s.panes) for s in self._parts.values())

    def closed_before(self, partition: int) -> int | None:
        state = self._parts.get(partition)
        return None if state is None else state.closed_before_ms
