"""A watchdog for faust's changelog recovery: restart a recovery that has stopped making progress.

Seen once in CI: after a rebalance, a worker sat in recovery for minutes ("Still fetching changelog
topics for recovery", every changelog partition at "have offset -1", 28 records to go) and never
resumed; its fetch never delivered. Restarting the recovery (as a new rebalance would: seek the
changelogs again, rebuild the highwaters, resume the partitions) is what faust does itself when the
assignment changes. Pure: the caller feeds a snapshot now and then and does what the verdict says.

- "ok": not recovering, or nothing left to read, or the remaining count moved since the last look;
- "restart": recovering, records left, and the remaining count has not moved for `stall_after_s`,
  doubled for each restart in a row that brought no progress (a restart itself re-seeks and costs
  fetch round trips: at a fixed period shorter than those, restarts would keep a recovery from ever
  finishing; with the doubling one always gets room);
- "give_up": `give_up_after` restarts in a row brought no progress: exit, and let the supervisor
  (the launcher, or an orchestrator) start the worker afresh.
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
