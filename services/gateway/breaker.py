"""Circuit breaker on the upstream (and on the tier node's lookups), by failures rather than latency:
generation is slow by nature, so a slow answer is not a sick server, but a run of 5xx, timeouts and
refused connections is. The shape of the L3 breaker (`services/tiers/l3/breaker.py`, DESIGN.md §3):
closed; open when failures reach `failure_ratio` of the last `window` calls (with at least `min_calls`)
or `consecutive` in a row; after `cooldown_ms` half-open, one probe at a time, closed again when it
succeeds.

Pure: the caller reports each call's outcome; the clock (monotonic ms) is passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerStats:
    state: BreakerState
    failures_in_window: int
    calls_in_window: int
    opened: int
    rejected: int
    failures: int
    reason: str | None


class FailureBreaker:
    def __init__(
        self,
        *,
        failure_ratio: float = 0.5,
        consecutive: int = 5,
        window: int = 50,
        min_calls: int = 10,
        cooldown_ms: int = 5_000,
        clock: Callable[[], int],
    ) -> None:
        if not 0 < failure_ratio <= 1:
            raise ValueError("failure_ratio must be in (0, 1]")
        if window < min_calls:
            raise ValueError("window must hold at least min_calls outcomes")
        self.failure_ratio = failure_ratio
        self.consecutive = consecutive
        self.min_calls = min_calls
        self.cooldown_ms = cooldown_ms
        self.clock = clock
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._in_a_row = 0
        self.state: BreakerState = "closed"
        self._opened_at = 0
        self._probe_out = False
        self.opened = 0
        self.rejected = 0
        self.failures = 0
        self.reason: str | None = None

    def allow(self) -> bool:
        """May a call go out now? In half-open, exactly one probe is let through at a time."""
        if self.state == "closed":
            return True
        if self.state == "open" and self.clock() - self._opened_at >= self.cooldown_ms:
            self.state = "half_open"
            self._probe_out = False
        if self.state == "half_open" and not self._probe_out:
            self._probe_out = True
            return True
        self.rejected += 1
        return False

    def available(self) -> bool:
        """Would `allow()` let a call through now? Asks without taking the half-open probe: choosing among
        instances or reporting health must not use up the one call that would close the breaker."""
        if self.state == "closed":
            return True
        if self.state == "open":
            return self.clock() - self._opened_at >= self.cooldown_ms
        return not self._probe_out

    def retry_after_ms(self) -> int:
        """How long until the next probe may go (0 when closed)."""
        if self.state == "closed":
            return 0
        return max(0, self._opened_at + self.cooldown_ms - self.clock())

    def abandon(self) -> None:
        """A call `allow()` let through was cancelled by its caller (a hedged request the cache answered
        first): it says nothing of the upstream's health; in half-open the next probe may go."""
        if self.state == "half_open":
            self._probe_out = False

    def record(self, ok: bool) -> None:
        """Report one call that `allow()` let through."""
        if not ok:
            self.failures += 1
        self._in_a_row = 0 if ok else self._in_a_row + 1
        if self.state == "half_open":
            self._probe_out = False
            if ok:
                self.state = "closed"
                self.reason = None
                self._outcomes.clear()
            else:
                self._open("probe failed")
            return
        self._outcomes.append(ok)
        if self.state != "closed":
            return
        failed = self._outcomes.count(False)
        if self._in_a_row >= self.consecutive:
            self._open(f"{self._in_a_row} failures in a row")
        elif len(self._outcomes) >= self.min_calls and failed >= self.failure_ratio * len(self._outcomes):
            self._open(f"{failed} of the last {len(self._outcomes)} calls failed")

    def _open(self, reason: str) -> None:
        self.state = "open"
        self._opened_at = self.clock()
        self.opened += 1
        self.reason = reason

    def stats(self) -> BreakerStats:
        return BreakerStats(
            state=self.state,
            failures_in_window=self._outcomes.count(False),
            calls_in_window=len(self._outcomes),
            opened=self.opened,
            rejected=self.rejected,
            failures=self.failures,
            reason=self.reason,
        )
