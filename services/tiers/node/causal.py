"""Order across nodes without trusting their wall clocks. A write or delete is stamped with the larger of
this node's wall clock and one past the newest stamp it has seen from elsewhere (another node's
invalidation, a row read from L3 or a peer): a write made after hearing of another node's write or
delete is stamped later than it even when this node's clock is seconds behind — a hybrid logical clock
(Kulkarni et al., 2014) kept in milliseconds, so stamps stay wall time to within the nodes' largest skew.
What it sees only moves it forward, and a stamp more than `max_ahead_ms` past this node's clock is not
believed (counted in `refused`): one bad clock cannot drag every node into the future.

Pure: the wall clock is passed in."""

from __future__ import annotations

from collections.abc import Callable


class CausalClock:
    def __init__(self, wall_ms: Callable[[], int], *, max_ahead_ms: int = 60_000) -> None:
        self.wall_ms = wall_ms
        self.max_ahead_ms = max_ahead_ms
        self.seen = -1  # the newest stamp seen from elsewhere
        self.refused = 0

    def now(self) -> int:
        """The stamp of a write or delete made now: after everything this node has heard of."""
        return max(self.wall_ms(), self.seen + 1)

    def observe(self, stamp_ms: int | None) -> None:
        if stamp_ms is None or stamp_ms <= self.seen:
            return
        if stamp_ms > self.wall_ms() + self.max_ahead_ms:
            self.refused += 1
            return
        self.seen = stamp_ms
