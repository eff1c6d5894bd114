"""Stage 1 on its own: watermarks with lateness and idleness, late and replayed records, and what
it persists."""

from __future__ import annotations

import pytest

from schemas.events import CacheAccessed, KvBlockStored, LatencySpikeDetected, RequestPenetrated
from streams.ingest import Ingest
from streams.records import parse_table_key

T0 = 1_767_225_600_000


def access(ts: int, key: str = "k", **kw: object) -> CacheAccessed:
    fields: dict[str, object] = {"hit": True, "shard": "s0", **kw}
    return CacheAccessed(event_id=f"{key}@{ts}", occurred_at_ms=ts, key=key, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("newest_ms", "wall_ms", "caught_up", "closed_before"),
    [
        (T0 + 1_100, T0 + 1_100, True, T0),  # the first pane is not past the 250 ms lateness yet
        (T0 + 1_250, T0 + 1_250, True, T0 + 1_000),
        (T0 + 3_700, T0 + 3_700, False, T0 + 3_000),
        (T0 + 500, T0 + 500 + 999, True, T0),  # quiet, but not for idle_ms yet
        (T0 + 500, T0 + 500 + 2_000, False, T0),  # quiet, but not consumed to its end
        (T0 + 500, T0 + 500 + 2_000, True, T0 + 2_000),  # idle: follows the event clock
    ],
)
def test_watermark_closes_panes(newest_ms: int, wall_ms: int, caught_up: bool, closed_before: int) -> None:
    ingest = Ingest(lateness_ms=250, idle_ms=1_000)
    ingest.assign(0)
    ingest.apply(0, 0, access(T0 + 10), T0 + 10)
    if newest_ms != T0 + 10:
        ingest.apply(0, 1, access(newest_ms), newest_ms)
    closing = ingest.close(wall_ms, {0: caught_up}, 1)
    # Progress moves to the pane boundary below the watermark; the panes before it are handed on.
    assert closing.progress is not None and closing.progress.closed_before_ms == {0: closed_before}
    with_data = {T0, newest_ms - newest_ms % 1_000}
    assert {p.pane_start_ms for p in closing.partials} == {s for s in with_data if s < closed_before}


def test_an_idle_partition_follows_the_others_instead_of_holding_them_back() -> None:
    ingest = Ingest(lateness_ms=0, idle_ms=1_000)
    ingest.assign(0)
    ingest.assign(1)
    ingest.apply(0, 0, access(T0 + 100), wall_ms=50)
    ingest.apply(0, 1, access(T0 + 5_500), wall_ms=1_500)
    closing = ingest.close(1_500, {0: True, 1: True}, 2)
    # Partition 1 never saw an event and is consumed to its end: it follows the event clock.
    assert closing.progress is not None and closing.progress.closed_before_ms == {
        0: T0 + 5_000,
        1: T0 + 5_000,
    }


def test_a_loaded_partition_without_records_yet_holds_the_others_for_idle_ms() -> None:
    """A partition the worker just loaded and that has delivered nothing yet (its fetch came back empty
    just before its first records were produced) is not idle until `idle_ms` after the load: closing
    its panes earlier would make those records late. A kill test lost 3 partitions' first panes so."""
    ingest = Ingest(lateness_ms=0, idle_ms=1_000)
    ingest.load(0, [], now_wall_ms=0)
    ingest.load(1, [], now_wall_ms=0)
    ingest.apply(0, 0, access(T0 + 5_500), wall_ms=500)
    early = ingest.close(500, {0: False, 1: True}, 2)
    assert early.progress is not None and early.progress.closed_before_ms == {0: T0 + 5_000}
    ingest.apply(1, 0, access(T0 + 200, key="late-fetched"), wall_ms=600)
    assert ingest.counters.late == 0
    later = ingest.close(2_000, {0: True, 1: True}, 2)
    assert later.progress is not None and later.progress.closed_before_ms[1] >= T0 + 5_000
    assert any(p.source_partition == 1 and p.pane_start_ms == T0 for p in later.partials)


def test_late_and_replayed_records_are_told_apart_and_not_counted_twice() -> None:
    ingest = Ingest(lateness_ms=0, idle_ms=10_000)
    ingest.assign(0)
    for offset, ts in enumerate((T0 + 100, T0 + 200, T0 + 2_100)):
        ingest.apply(0, offset, access(ts), ts)
    closing = ingest.close(T0 + 2_100, {0: False}, 1)
    (partial,) = [p for p in closing.partials if p.group == ("s0", None)]
    assert partial.aggregate.requests == 2
    ingest.apply(0, 1, access(T0 + 200), T0 + 2_200)  # a redelivery of offset 1
    ingest.apply(0, 3, access(T0 + 300), T0 + 2_200)  # genuinely late
    ingest.apply(0, 2, access(T0 + 2_100), T0 + 2_200)  # redelivered into an open pane
    assert (ingest.counters.applied, ingest.counters.replayed, ingest.counters.late) == (3, 2, 1)


def test_a_record_missed_by_the_first_delivery_counts_when_it_is_delivered_again() -> None:
    # faust can drop a fetched record mid-rebalance and hand on the next ones; the re-read from the
    # committed offset brings it again, with the ones already applied.
    ingest = Ingest(lateness_ms=0, idle_ms=10_000)
    ingest.assign(0)
    ingest.apply(0, 0, access(T0 + 100), T0 + 100)
    ingest.apply(0, 2, access(T0 + 300), T0 + 300)  # offset 1 missed
    for offset, ts in enumerate((T0 + 100, T0 + 200, T0 + 300)):
        ingest.apply(0, offset, access(ts), T0 + 400)
    ingest.apply(0, 3, access(T0 + 1_100), T0 + 1_100)
    closing = ingest.close(T0 + 1_100, {0: False}, 1)
    (partial,) = [p for p in closing.partials if p.group == ("s0", None)]
    assert partial.aggregate.requests == 3
    assert (ingest.counters.applied, ingest.counters.replayed) == (4, 2)


def test_only_progress_is_persisted_and_a_restart_rebuilds_open_panes_from_the_replay() -> None:
    ingest = Ingest(lateness_ms=0, idle_ms=10_000)
    ingest.assign(3)
    for offset, ts in enumerate((T0 + 1, T0 + 500, T0 + 1_200)):
        ingest.apply(3, offset, access(ts, model="m"), ts)
    closing = ingest.close(T0 + 1_200, {3: False}, 6)
    (write,) = closing.writes
    assert parse_table_key(write.key) == ["progress", 3] and write.partition == 3
    assert write.value == {"max": T0 + 1_200, "closed": T0 + 1_000, "off": 2}
    # A new worker: it knows where partition 3 stands; the replay (from the first record of the
    # open pane, or earlier) skips what was handed on and rebuilds the open pane.
    restored = Ingest(lateness_ms=0, idle_ms=10_000)
    restored.load(3, [(write.key, write.value)])
    for offset, ts in enumerate((T0 + 1, T0 + 500, T0 + 1_200)):
        restored.apply(3, offset, access(ts, model="m"), T0 + 5_000)
    assert restored.counters.replayed == 2 and restored.counters.late == 0
    assert restored.open_panes() == 4  # one pane per group of the record at T0 + 1.2 s
    assert restored.closed_before(3) == T0 + 1_000


def test_penetrations_and_spikes_go_out_at_once_and_kv_stores_set_warm_times() -> None:
    ingest = Ingest(spike_rtt_ms=320)
    ingest.assign(0)
    ingest.apply(0, 0, KvBlockStored(block_hash="k", occurred_at_ms=T0 - 300), T0)
    out = ingest.apply(0, 1, access(T0, layer="token", hit=False, latency_ms=500.0), T0)
    penetrated = [e for e in out if isinstance(e, RequestPenetrated)]
    spikes = [e for e in out if isinstance(e, LatencySpikeDetected)]
    assert len(penetrated) == 1 and penetrated[0].shard == "s0" and penetrated[0].latency_ms == 500.0
    assert len(spikes) == 1 and spikes[0].delta_t_ms == 300


def test_an_idle_partition_follows_the_slowest_active_one_not_the_fastest() -> None:
    ingest = Ingest(lateness_ms=0, idle_ms=1_000)
    for p in range(3):
        ingest.assign(p)
    ingest.apply(0, 0, access(T0 + 5_500), wall_ms=2_000)
    ingest.apply(1, 0, access(T0 + 2_500, key="b"), wall_ms=2_000)
    marks = ingest.watermarks(2_000, {0: True, 1: True, 2: True})
    assert marks == {0: T0 + 5_500, 1: T0 + 2_500, 2: T0 + 2_500}
    # Once everything is quiet, all follow the event clock: newest event + wall time since.
    assert ingest.watermarks(4_000, {0: True, 1: True, 2: True}) == dict.fromkeys(range(3), T0 + 7_500)
    # Not consumed to its end (or no fresh fetch): it holds its own.
    assert ingest.watermarks(4_000, {0: True, 1: False, 2: True})[0] == T0 + 5_500
    assert ingest.watermarks(4_000, {0: True, 1: False, 2: True})[2] == T0 + 2_500


def test_a_batch_record_counts_each_event_once_also_when_replayed() -> None:
    """A `CacheAccessBatch` is its events, each at its own position (offset, index): a batch seen
    again, whole or from an earlier offset, adds nothing; the table keeps the record's offset."""
    ingest = Ingest(lateness_ms=250, idle_ms=1_000)
    ingest.assign(0)
    batch = [access(T0 + 10 * n, key=f"k{n % 3}") for n in range(40)]
    for index, event in enumerate(batch):
        ingest.apply(0, 7, event, T0, index)
    for index, event in enumerate(batch[:25]):  # redelivered (a rebalance): skipped event by event
        ingest.apply(0, 7, event, T0, index)
    assert (ingest.counters.applied, ingest.counters.replayed) == (40, 25)
    ingest.apply(0, 8, access(T0 + 1_400), T0 + 1_400)
    closing = ingest.close(T0 + 1_400, {0: False}, 1)
    (pane,) = [p for p in closing.partials if p.group == ("s0", None)]
    assert pane.aggregate.requests == 40 and pane.aggregate.keys == {"k0": 14, "k1": 13, "k2": 13}
    (write,) = closing.writes
    assert write.value["off"] == 8

    # After a restart from that progress, the replayed batch is recognised as already counted.
    restarted = Ingest(lateness_ms=250, idle_ms=1_000)
    restarted.load(0, [(write.key, write.value)])
    for index, event in enumerate(batch):
        restarted.apply(0, 7, event, T0 + 2_000, index)
    assert (restarted.counters.applied, restarted.counters.replayed, restarted.counters.late) == (0, 40, 0)
