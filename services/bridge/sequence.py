"""Sequence numbers of one vLLM publisher, decided without I/O: forward a batch, skip one already
forwarded, fill a gap from the replay socket, or notice that the engine restarted.

vLLM numbers batches 0, 1, 2, ... per publisher (`itertools.count()`); PUB delivers each at most once,
in order, so on the live socket a number at or below the last one *heard live* means the engine
restarted (a new epoch, numbered from 0 again), while one at or below the last *forwarded* (but above
the last heard) is a batch a replay already delivered. A bridge that starts from a saved position
treats that position as heard: whatever it hears next that is not above it is a new incarnation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LiveVerdict = Literal["forward", "duplicate", "gap", "restart"]


@dataclass(frozen=True, slots=True)
class Position:
    """How far a publisher's stream has been forwarded: `seq` (-1: nothing yet) within `epoch`."""

    epoch: int = 0
    seq: int = -1


@dataclass
class SeqTracker:
    epoch: int = 0
    last_forwarded: int = -1
    last_live: int = -1
    lost: int = 0

    @classmethod
    def resume(cls, position: Position) -> SeqTracker:
        return cls(position.epoch, position.seq, position.seq)

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.last_forwarded)

    @property
    def next_seq(self) -> int:
        return self.last_forwarded + 1

    def on_live(self, seq: int) -> LiveVerdict:
        """A batch heard on the PUB socket. After "restart" the tracker is in the new epoch with
        nothing forwarded, and the caller treats the batch as it would a "gap" (or forwards it if 0)."""
        if seq <= self.last_live:
            self.epoch += 1
            self.last_forwarded = -1
            self.last_live = seq
            return "restart"
        self.last_live = seq
        if seq <= self.last_forwarded:
            return "duplicate"
        if seq == self.next_seq:
            return "forward"
        return "gap"

    def on_replayed(self, seq: int) -> bool:
        """A batch from the replay socket: True to forward it. Numbers the replay no longer holds
        (its buffer moved on) are counted as lost."""
        if seq < self.next_seq:
            return False
        self.lost += seq - self.next_seq
        return True

    def skip_to(self, seq: int) -> None:
        """The gap before `seq` could not be filled (no replay socket, or it timed out): count it."""
        if seq > self.next_seq:
            self.lost += seq - self.next_seq

    def forwarded(self, seq: int) -> None:
        self.last_forwarded = max(self.last_forwarded, seq)
