"""The two window stages, driven without Kafka: whatever the partition interleaving, and across a
crash with replay from older offsets, they emit exactly the windows and clusters computed offline."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

import pytest

from infra.generator import DEFAULT_BASE_MS, merge_by_time, migration_events, pulse_events
from schemas.events import CacheAccessed, DriftClustered, Event, WindowComputed
from streams.ingest import Ingest
from streams.merge import Merge
from streams.offline import offline_drift, offline_windows
from streams.records import Partial, Progress, TableWrite

SOURCES = 4
HANDOFF = 3


def _events() -> list[CacheAccessed]:
    base = DEFAULT_BASE_MS
    rng = random.Random(7)
    background = [
        CacheAccessed(
            event_id=f"bg-{n}",
            occurred_at_ms=base + n * 37,
            key=f"k{rng.randint(0, 60)}",
            hit=rng.random() < 0.6,
            tier=rng.choice(["l1", "l2", "l3"]),
            layer=rng.choice([None, "model", "sequence", "token"]),
            latency_ms=rng.choice([0.5, 3.0, 40.0, 400.0]),
            shard=f"s{n % 2}",
            model=rng.choice([None, "m7", "m13"]),
            service=f"svc-{n % 8}",
            call_depth=1 + n % 3,
        )
        for n in range(1_500)
    ]
    planted = merge_by_time(migration_events(base + 2_000, duration_ms=40_000), pulse_events(base + 35_000))
    return [e for e in merge_by_time(background, planted) if isinstance(e, CacheAccessed)]


def _partition(event: CacheAccessed) -> int:
    return zlib.crc32(event.key.encode()) % SOURCES


@dataclass
class Harness:
    """Plays Kafka: partitions, offsets, the hand-off topic and the changelogs."""

    ingest: Ingest = field(default_factory=lambda: Ingest(lateness_ms=250, idle_ms=1_000))
    merge: Merge = field(default_factory=Merge)
    changelog_ingest: dict[str, object] = field(default_factory=dict)
    changelog_merge: dict[str, object] = field(default_factory=dict)
    emitted: list[Event] = field(default_factory=list)
    handoff_queue: list[tuple[int, Partial | Progress]] = field(default_factory=list)
    before_last_progress: dict[str, object] = field(default_factory=dict)

    def write(self, store: dict[str, object], writes: list[TableWrite]) -> None:
        for w in writes:
            if w.value is None:
                store.pop(w.key, None)
            else:
                store[w.key] = w.value

    def tick(self, wall_ms: int, caught_up: dict[int, bool]) -> None:
        closing = self.ingest.close(wall_ms, caught_up, SOURCES)
        for partial in closing.partials:
            self.handoff_queue.append((zlib.crc32(partial.routing_key().encode()) % HANDOFF, partial))
        if closing.progress is not None:
            self.handoff_queue.extend((q, closing.progress) for q in range(HANDOFF))
        self.before_last_progress = dict(self.changelog_ingest)
        self.write(self.changelog_ingest, closing.writes)
        self.drain()

    def drain(self) -> None:
        queue, self.handoff_queue = self.handoff_queue, []
        for q, record in queue:
            if isinstance(record, Partial):
                self.write(self.changelog_merge, self.merge.apply_partial(q, record))
            else:
                self.write(self.changelog_merge, self.merge.apply_progress(q, record))
                emission = self.merge.emit(q)
                self.emitted.extend(emission.events)
                self.write(self.changelog_merge, emission.writes)

    def restart(self, lose_last_progress: bool = False) -> None:
        """A new worker: state rebuilt from the changelogs only; optionally the crash came after
        the last partials were delivered but before the progress that followed them was written."""
        if lose_last_progress:
            self.changelog_ingest = self.before_last_progress
        self.ingest = Ingest(lateness_ms=250, idle_ms=1_000)
        self.merge = Merge()
        for p in range(SOURCES):
            self.ingest.load(p, list(self.changelog_ingest.items()))
        for q in range(HANDOFF):
            self.merge.load(q, list(self.changelog_merge.items()))


def _acked_upto(events: list[CacheAccessed], position: int, closed_before: int | None) -> int:
    """The first offset not acknowledged: records are acked, in order, once their pane is closed."""
    for offset in range(position):
        if (
            closed_before is None
            or events[offset].occurred_at_ms - events[offset].occurred_at_ms % 1000 >= closed_before
        ):
            return offset
    return position


def _run(
    seed: int, crash_at: int | None = None, replay_back: int = 0, lose_progress: bool = False
) -> list[Event]:
    events = _events()
    by_partition: dict[int, list[CacheAccessed]] = {p: [] for p in range(SOURCES)}
    for e in events:
        by_partition[_partition(e)].append(e)
    rng = random.Random(seed)
    h = Harness()
    for p in range(SOURCES):
        h.ingest.assign(p)
    position = dict.fromkeys(range(SOURCES), 0)
    committed = dict.fromkeys(range(SOURCES), 0)
    wall = events[0].occurred_at_ms
    steps = 0
    crashed = False
    while any(position[p] < len(by_partition[p]) for p in range(SOURCES)):
        # Uneven progress: one partition may run far ahead of another.
        live = [p for p in range(SOURCES) if position[p] < len(by_partition[p])]
        p = rng.choice(live)
        for _ in range(rng.randint(1, 40)):
            if position[p] >= len(by_partition[p]):
                break
            event = by_partition[p][position[p]]
            h.ingest.apply(p, position[p], event, wall)
            position[p] += 1
            wall = max(wall, event.occurred_at_ms)
        steps += 1
        if steps % 5 == 0:
            h.tick(wall, dict.fromkeys(range(SOURCES), False))
            if steps % 20 == 0:
                # A commit: up to the first record whose pane is still open (what the acks allow),
                # or further back (a commit that lags behind the acks).
                committed = {
                    q: max(
                        0,
                        _acked_upto(by_partition[q], position[q], h.ingest.closed_before(q))
                        - rng.randint(0, replay_back),
                    )
                    for q in range(SOURCES)
                }
        if crash_at is not None and not crashed and steps == crash_at:
            crashed = True
            h.restart(lose_progress)
            position = dict(committed)  # replay from the (possibly older) committed offsets
    for _ in range(30):  # idle: the watermarks follow the wall clock until every window is out
        wall += 1_000
        h.tick(wall, dict.fromkeys(range(SOURCES), True))
    return h.emitted


def _by_identity(events: list[Event]) -> dict[str, Event]:
    out: dict[str, Event] = {}
    for e in events:
        if e.event_id in out:
            assert out[e.event_id] == e, "a re-emitted event must be identical"
        out[e.event_id] = e
    return out


def _assert_same_windows(got: list[Event], want: list[Event]) -> None:
    got_by_id, want_by_id = _by_identity(got), _by_identity(want)
    assert sorted(got_by_id) == sorted(want_by_id)
    for event_id, expected in want_by_id.items():
        actual = got_by_id[event_id]
        if isinstance(expected, WindowComputed):
            assert isinstance(actual, WindowComputed)
            for name in ("requests", "hits", "distinct_keys", "penetrated", "latency_spikes"):
                assert getattr(actual, name) == getattr(expected, name), name
            assert actual.entropy_bits == expected.entropy_bits
            assert actual.hit_rate_by_tier == expected.hit_rate_by_tier
            assert actual.penetration_by_layer == expected.penetration_by_layer
            assert actual.miss_latency_ms_p95 == expected.miss_latency_ms_p95
            for layer, ms in expected.added_latency_ms_by_layer.items():
                assert actual.added_latency_ms_by_layer[layer] == pytest.approx(ms, rel=1e-9, abs=1e-9)
        else:
            assert actual == expected


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stream_stages_emit_exactly_the_offline_windows_whatever_the_interleaving(seed: int) -> None:
    events = _events()
    emitted = _run(seed)
    _assert_same_windows([e for e in emitted if isinstance(e, WindowComputed)], list(offline_windows(events)))
    _assert_same_windows([e for e in emitted if isinstance(e, DriftClustered)], list(offline_drift(events)))


@pytest.mark.parametrize(
    ("crash_at", "replay_back", "lose_progress"),
    [(7, 0, False), (23, 30, True), (41, 200, False), (60, 0, True)],
)
def test_a_crash_and_replay_from_older_offsets_loses_and_doubles_nothing(
    crash_at: int, replay_back: int, lose_progress: bool
) -> None:
    events = _events()
    emitted = _run(seed=5, crash_at=crash_at, replay_back=replay_back, lose_progress=lose_progress)
    _assert_same_windows([e for e in emitted if isinstance(e, WindowComputed)], list(offline_windows(events)))
    _assert_same_windows([e for e in emitted if isinstance(e, DriftClustered)], list(offline_drift(events)))
