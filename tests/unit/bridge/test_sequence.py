"""Sequence-number decisions of the bridge, as a table: forward, duplicate, gap, engine restart, and
what a replay fills or leaves lost."""

from __future__ import annotations

import pytest

from services.bridge.sequence import Position, SeqTracker


def test_in_order_batches_are_forwarded() -> None:
    t = SeqTracker()
    for seq in range(3):
        assert t.on_live(seq) == "forward"
        t.forwarded(seq)
    assert t.position == Position(0, 2) and t.lost == 0


def test_a_gap_then_the_replay_fills_it_and_later_live_copies_are_duplicates() -> None:
    t = SeqTracker()
    t.on_live(0)
    t.forwarded(0)
    assert t.on_live(3) == "gap"  # 1 and 2 never arrived on PUB
    assert t.next_seq == 1
    for seq in (1, 2, 3, 4):  # the replay holds everything up to now
        assert t.on_replayed(seq)
        t.forwarded(seq)
    assert not t.on_replayed(4)
    assert t.on_live(4) == "duplicate"  # queued on SUB while the replay ran
    assert t.on_live(5) == "forward"
    assert t.lost == 0


def test_a_replay_that_no_longer_holds_the_gap_counts_it_lost() -> None:
    t = SeqTracker.resume(Position(0, 9))
    assert t.on_replayed(15)  # the buffer moved on past 10..14
    assert t.lost == 5


def test_a_gap_nothing_can_fill_is_skipped_and_counted() -> None:
    t = SeqTracker.resume(Position(0, 9))
    assert t.on_live(12) == "gap"
    t.skip_to(12)
    t.forwarded(12)
    assert t.lost == 2 and t.next_seq == 13


@pytest.mark.parametrize(
    ("saved", "heard"), [(Position(2, 40), 0), (Position(2, 40), 7), (Position(2, 40), 40)]
)
def test_a_number_not_above_the_last_heard_is_an_engine_restart(saved: Position, heard: int) -> None:
    t = SeqTracker.resume(saved)
    assert t.on_live(heard) == "restart"
    assert t.epoch == 3 and t.next_seq == 0  # a new epoch, from the start: the replay is asked from 0


def test_resuming_asks_for_what_came_after_the_saved_position() -> None:
    t = SeqTracker.resume(Position(1, 99))
    assert t.next_seq == 100
    assert t.on_replayed(100)
    t.forwarded(100)
    assert t.on_live(100) == "duplicate"
    assert t.on_live(101) == "forward"
