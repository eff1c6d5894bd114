"""Stage 2 applies each hand-off record once, in offset order: it knows the next offset it needs
(kept in its `wm` entry), skips re-delivered records and reports the ones the consumer skipped."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import CacheAccessed
from streams.merge import Merge
from streams.records import Partial, Progress, TableWrite, parse_table_key
from streams.windows import TUMBLING_1S, PaneAggregate

BASE = 1_767_225_600_000
Q = 0


def _partial(source: int, pane: int, requests: int) -> Partial:
    aggregate = PaneAggregate.for_group(("*", None))
    for n in range(requests):
        aggregate.add(
            CacheAccessed(
                event_id=f"{source}-{pane}-{n}",
                occurred_at_ms=BASE + pane * 1_000 + n,
                key=f"k{source}-{n}",
                hit=True,
                tier="l1",
                latency_ms=1.0,
                shard="s0",
                service="svc",
            ),
            320.0,
        )
    return Partial(source, ("*", None), BASE + pane * 1_000, aggregate)


# The hand-off partition: two sources, a pane each, then progress past it.
LOG: list[Partial | Progress] = [
    Progress(2, {0: BASE, 1: BASE}),
    _partial(0, 0, 3),
    _partial(1, 0, 4),
    Progress(2, {0: BASE + 1_000}),
    Progress(2, {1: BASE + 1_000}),
]


def _apply(merge: Merge, table: dict[str, Any], offset: int, emitted: list[int]) -> None:
    record = LOG[offset]
    writes: list[TableWrite]
    if isinstance(record, Partial):
        writes = merge.apply_partial(Q, record, offset)
    else:
        writes = merge.apply_progress(Q, record, offset)
        if writes:
            emission = merge.emit(Q)
            emitted.extend(w.requests for w in emission.windows if w.window == TUMBLING_1S.name)
            writes = [*emission.writes, *writes]
    for w in writes:
        if w.value is None:
            table.pop(w.key, None)
        else:
            table[w.key] = w.value


def _deliver(merge: Merge, table: dict[str, Any], offsets: list[int], emitted: list[int]) -> None:
    """What the adapter does: skip what is applied, read the skipped offsets again first."""
    for offset in offsets:
        if merge.applied(Q, offset):
            continue
        missed = merge.missed(Q, offset)
        if missed is not None:
            for again in range(*missed):
                _apply(merge, table, again, emitted)
        _apply(merge, table, offset, emitted)


def test_a_fresh_partition_needs_its_first_record() -> None:
    merge = Merge()
    merge.assign(Q)
    assert merge.missed(Q, 0) is None
    assert merge.missed(Q, 3) == (0, 3)
    assert not merge.applied(Q, 0)


@pytest.mark.parametrize(
    ("crash_after", "resume_at"),
    [
        (1, 0),  # re-delivered from an older commit
        (1, 3),  # the consumer skipped the partials
        (2, 4),  # the commit ran ahead of the last progress entry
        (3, 3),
        (3, 4),
        (4, 1),
    ],
)
def test_a_restart_from_any_offset_emits_the_whole_pane_once(crash_after: int, resume_at: int) -> None:
    merge, table, emitted = Merge(), {}, []  # type: ignore[var-annotated]
    merge.assign(Q)
    _deliver(merge, table, list(range(crash_after + 1)), emitted)

    restored = Merge()
    restored.load(Q, list(table.items()))
    _deliver(restored, table, list(range(resume_at, len(LOG))), emitted)

    assert emitted == [7]


def test_the_progress_entry_carries_the_next_offset_and_comes_back() -> None:
    merge = Merge()
    merge.assign(Q)
    writes = merge.apply_progress(Q, LOG[0], 41)  # type: ignore[arg-type]
    assert [parse_table_key(w.key)[0] for w in writes] == ["wm"] and writes[0].value["o"] == 42
    restored = Merge()
    restored.load(Q, [(w.key, w.value) for w in writes])
    assert restored.applied(Q, 41) and not restored.applied(Q, 42)
    assert restored.missed(Q, 45) == (42, 45)


def test_an_entry_without_an_offset_trusts_the_consumer() -> None:
    """A `wm` entry written before offsets were kept: nothing is reported missing or applied until
    the next record sets the offset."""
    merge = Merge()
    merge.load(Q, [('["wm",0]', {"n": 2, "c": {"0": BASE, "1": BASE}})])
    assert merge.missed(Q, 90) is None and not merge.applied(Q, 3)
    merge.apply_partial(Q, LOG[1], 90)  # type: ignore[arg-type]
    assert merge.applied(Q, 90) and merge.missed(Q, 92) == (91, 92)
