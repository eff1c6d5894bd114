"""Sequence numbers of one vLLM publisher, decided without I/O: forward a batch, skip one already
forwarded, fill a gap from the replay socket, or notice that the engine restarted.

A number at or below the last one heard live means a restart; one at or below the last forwarded but
above the last heard is told apart (the same batch again, or a restarted engine's) by a digest of the
replayed batch's payload. Why: docs/bridge.md ("Sequence numbers").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LiveVerdict = Literal["forward", "duplicate", "gap", "restart"]

MAX_REPLAYED_DIGESTS = 100_000
"""Digests kept of batches forwarded from the replay but not yet passed live (16 bytes each). Past
this many the oldest go, and a live batch whose number has no digest is taken for a duplicate."""


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
    replayed: dict[int, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def resume(cls, position: Position) -> SeqTracker:
        return cls(position.epoch, position.seq, position.seq)

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.last_forwarded)

    @property
    def next_seq(self) -> int:
        return self.last_forwarded + 1

    def on_live(self, seq: int, digest: bytes) -> LiveVerdict:
        """A batch heard on the PUB socket, with its payload's digest. After "restart" the tracker is
        in the new epoch with nothing forwarded, and the caller treats the batch as it would a "gap"
        (or forwards it if 0)."""
        if seq <= self.last_live or (seq <= self.last_forwarded and self._replayed_other(seq, digest)):
            self.epoch += 1
            self.last_forwarded = -1
            self.last_live = seq
            self.replayed.clear()
            return "restart"
        self.last_live = seq
        self._forget_through(seq)
        if seq <= self.last_forwarded:
            return "duplicate"
        if seq == self.next_seq:
            return "forward"
        return "gap"

    def on_replayed(self, seq: int, digest: bytes) -> bool:
        """A batch from the replay socket: True to forward it. Numbers the replay no longer holds
        (its buffer moved on) are counted as lost."""
        if seq < self.next_seq:
            return False
        self.lost += seq - self.next_seq
        self.replayed[seq] = digest
        if len(self.replayed) > MAX_REPLAYED_DIGESTS:
            del self.replayed[next(iter(self.replayed))]
        return True

    def _replayed_other(self, seq: int, digest: bytes) -> bool:
        """Whether a replayed batch under `seq` had a different payload (no digest: assume the same)."""
        known = self.replayed.get(seq)
        return known is not None and known != digest

    def _forget_through(self, seq: int) -> None:
        while self.replayed and next(iter(self.replayed)) <= seq:
            del self.replayed[next(iter(self.replayed))]

    def skip_to(self, seq: int) -> None:
        """The gap before `seq` could not be filled (no replay socket, or it timed out): count it."""
        if seq > self.next_seq:
            self.lost += seq - self.next_seq

    def forwarded(self, seq: int) -> None:
        self.last_forwarded = max(self.last_forwarded, seq)
