"""A watchdog for faust's changelog recovery: restart a recovery that has stopped making progress.

Pure: the caller feeds a snapshot now and then and does what the verdict says: "ok", "restart" (no
progress for `stall_after_s`, doubled for each restart in a row that brought none) or "give_up" (after
`give_up_after` such restarts). Why it exists, and why the doubling: docs/streams.md ("The recovery
watchdog").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["ok", "restart", "give_up"]


@dataclass(slots=True)
class RecoveryWatch:
    stall_after_s: float = 30.0
    give_up_after: int = 3
    restarts: int = 0  # restarts asked for, in all
    _remaining: int | None = None
    _since: float = 0.0
    _in_a_row: int = 0

    def stall_period(self) -> float:
        """How long the count must stand still before the next verdict: `stall_after_s`, doubled per
        restart in a row without progress (at most 1,024 times)."""
        return self.stall_after_s * 2 ** min(self._in_a_row, 10)

    def observe(self, now_s: float, recovering: bool, remaining: int) -> Verdict:
        """`remaining`: changelog records still to read (highwaters minus offsets, summed)."""
        if not recovering or remaining <= 0:
            self._remaining, self._in_a_row = None, 0
            return "ok"
        if remaining != self._remaining:
            if self._remaining is not None and remaining < self._remaining:
                self._in_a_row = 0  # it read something: the restarts so far did their job
            self._remaining, self._since = remaining, now_s
            return "ok"
        if now_s - self._since < self.stall_period():
            return "ok"
        self._since = now_s  # the next verdict waits a whole (doubled) stall period again
        if self._in_a_row >= self.give_up_after:
            return "give_up"
        self._in_a_row += 1
        self.restarts += 1
        return "restart"
