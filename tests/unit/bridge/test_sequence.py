"""Sequence-number decisions of the bridge, as a table: forward, duplicate, gap, engine restart, and
what a replay fills or leaves lost."""

from __future__ import annotations

import pytest

from services.bridge.sequence import MAX_REPLAYED_DIGESTS, Position, SeqTracker


def d(seq: int, incarnation: int = 0) -> bytes:
    """The digest of batch `seq` of one incarnation of the engine (a restarted one sends others)."""
    return f"{incarnation}:{seq}".encode()


def test_in_order_batches_are_forwarded() -> None:
    t = SeqTracker()
    for seq in range(3):
        assert t.on_live(seq, d(seq)) == "forward"
        t.forwarded(seq)
    assert t.position == Position(0, 2) and t.lost == 0


def test_a_gap_then_the_replay_fills_it_and_later_live_copies_are_duplicates() -> None:
    t = SeqTracker()
    t.on_live(0, d(0))
    t.forwarded(0)
    assert t.on_live(3, d(3)) == "gap"  # 1 and 2 never arrived on PUB
    assert t.next_seq == 1
    for seq in (1, 2, 3, 4):  # the replay holds everything up to now
        assert t.on_replayed(seq, d(seq))
        t.forwarded(seq)
    assert not t.on_replayed(4, d(4))
    assert t.on_live(4, d(4)) == "duplicate"  # queued on SUB while the replay ran
    assert t.on_live(5, d(5)) == "forward"
    assert t.lost == 0


def test_a_replay_that_no_longer_holds_the_gap_counts_it_lost() -> None:
    t = SeqTracker.resume(Position(0, 9))
    assert t.on_replayed(15, d(15))  # the buffer moved on past 10..14
    assert t.lost == 5


def test_a_gap_nothing_can_fill_is_skipped_and_counted() -> None:
    t = SeqTracker.resume(Position(0, 9))
    assert t.on_live(12, d(12)) == "gap"
    t.skip_to(12)
    t.forwarded(12)
    assert t.lost == 2 and t.next_seq == 13


@pytest.mark.parametrize(
    ("saved", "heard"), [(Position(2, 40), 0), (Position(2, 40), 7), (Position(2, 40), 40)]
)
def test_a_number_not_above_the_last_heard_is_an_engine_restart(saved: Position, heard: int) -> None:
    t = SeqTracker.resume(saved)
    assert t.on_live(heard, d(heard)) == "restart"
    assert t.epoch == 3 and t.next_seq == 0  # a new epoch, from the start: the replay is asked from 0


def test_resuming_asks_for_what_came_after_the_saved_position() -> None:
    t = SeqTracker.resume(Position(1, 99))
    assert t.next_seq == 100
    assert t.on_replayed(100, d(100))
    t.forwarded(100)
    assert t.on_live(100, d(100)) == "duplicate"
    assert t.on_live(101, d(101)) == "forward"


def test_a_restart_after_a_first_start_replay_is_told_from_duplicates_by_the_payload() -> None:
    # The first start replayed 0..2 (nothing heard live yet), then the engine restarted: its new 0..2
    # are not the replayed batches, so they open a new epoch instead of being dropped as duplicates.
    t = SeqTracker()
    for seq in range(3):
        assert t.on_replayed(seq, d(seq))
        t.forwarded(seq)
    assert t.on_live(0, d(0, incarnation=1)) == "restart"
    t.forwarded(0)
    assert t.epoch == 1 and t.on_live(1, d(1, incarnation=1)) == "forward"


def test_the_same_batch_live_after_its_replay_is_a_duplicate_and_its_digest_is_let_go() -> None:
    t = SeqTracker()
    for seq in range(3):
        t.on_replayed(seq, d(seq))
        t.forwarded(seq)
    assert t.on_live(1, d(1)) == "duplicate"
    assert sorted(t.replayed) == [2]  # what was passed live can no longer be confused
    assert t.on_live(2, d(2)) == "duplicate" and not t.replayed
    assert t.on_live(3, d(3)) == "forward" and t.epoch == 0


def test_the_kept_digests_are_bounded() -> None:
    t = SeqTracker()
    for seq in range(MAX_REPLAYED_DIGESTS + 10):
        t.on_replayed(seq, d(seq))
        t.forwarded(seq)
    assert len(t.replayed) == MAX_REPLAYED_DIGESTS and min(t.replayed) == 10
    assert t.on_live(3, d(3, incarnation=1)) == "duplicate"  # no digest left: taken for the same batch
