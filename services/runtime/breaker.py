"""Circuit breakers (pure: the caller reports each call; the clock, monotonic ms, is passed in).

One state machine: closed; open when the trip rule says so; after `cooldown_ms` half-open, one probe
at a time, closed again when the probe passes. Two trip rules on it:
- `FailureBreaker` (the gateway, on its upstreams and the tier node): failures make up `failure_ratio`
  of the last `window` calls, or `consecutive` come in a row. Generation is slow by nature: a slow
  answer is not a sick server, a run of 5xx, timeouts and refused connections is.
- `LatencyBreaker` (a tier node, on L3): the P99 of the recent calls passes a bound (150 ms,
  docs/design.md §4.4); the node then serves lookups from L1/L2. A call the client waits for anyway (a
  durable write) still goes while it is open only for slowness (`allow_slow`), not while calls fail.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

BreakerState = Literal["closed", "open", "half_open"]


class Breaker:
    """The state machine; a subclass decides when to trip (`_open`) and what closes it."""

    def __init__(self, *, cooldown_ms: int, clock: Callable[[], int]) -> None:
        self.cooldown_ms = cooldown_ms
        self.clock = clock
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
        first): it says nothing of the other side's health; in half-open the next probe may go."""
        if self.state == "half_open":
            self._probe_out = False

    def _open(self, reason: str) -> None:
        self.state = "open"
        self._opened_at = self.clock()
        self.opened += 1
        self.reason = reason

    def _close(self) -> None:
        self.state = "closed"
        self.reason = None


@dataclass(frozen=True, slots=True)
class BreakerStats:
    """What every breaker reports; each trip rule adds what it decides on."""

    state: BreakerState
    calls_in_window: int
    opened: int
    rejected: int
    failures: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class FailureStats(BreakerStats):
    failures_in_window: int = 0


class FailureBreaker(Breaker):
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
        super().__init__(cooldown_ms=cooldown_ms, clock=clock)
        self.failure_ratio = failure_ratio
        self.consecutive = consecutive
        self.min_calls = min_calls
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._in_a_row = 0

    def record(self, ok: bool) -> None:
        """Report one call that `allow()` let through."""
        if not ok:
            self.failures += 1
        self._in_a_row = 0 if ok else self._in_a_row + 1
        if self.state == "half_open":
            self._probe_out = False
            if ok:
                self._close()
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

    def stats(self) -> FailureStats:
        return FailureStats(
            state=self.state,
            failures_in_window=self._outcomes.count(False),
            calls_in_window=len(self._outcomes),
            opened=self.opened,
            rejected=self.rejected,
            failures=self.failures,
            reason=self.reason,
        )


@dataclass(frozen=True, slots=True)
class LatencyStats(BreakerStats):
    p99_ms: float | None = None


class LatencyBreaker(Breaker):
    def __init__(
        self,
        *,
        p99_ms: float = 150.0,
        window: int = 200,
        min_calls: int = 20,
        cooldown_ms: int = 5_000,
        clock: Callable[[], int],
    ) -> None:
        if window < min_calls:
            raise ValueError("window must hold at least min_calls samples")
        super().__init__(cooldown_ms=cooldown_ms, clock=clock)
        self.p99_bound_ms = p99_ms
        self.min_calls = min_calls
        self._samples: deque[float] = deque(maxlen=window)
        self._failed: deque[bool] = deque(maxlen=window)  # which samples in the window are failures
        # Samples in the window above the bound: while none is, the P99 cannot be either, so the
        # percentile (tens of microseconds, on every L3 call of a lookup) need not be computed.
        self._over = 0
        self.failing = False  # opened because calls failed, not only because they were slow
        # Hears every call reported (its latency in ms, whether it succeeded): the latency histogram.
        self.observe: Callable[[float, bool], None] | None = None

    def p99_ms(self) -> float | None:
        if not self._samples:
            return None
        return float(np.percentile(np.fromiter(self._samples, float, len(self._samples)), 99))

    def allow_slow(self) -> bool:
        """May a call that a client waits for anyway go to L3 now? Yes unless the breaker is open because
        calls fail (a slow L3 still takes a durable write; a failing one would only time it out).
        Report its outcome with `record_slow`."""
        return self.state == "closed" or not self.failing

    def record_slow(self, latency_ms: float, ok: bool = True) -> None:
        """Report a call let through by `allow_slow` while the breaker is not closed: a failure marks the
        breaker failing (and restarts its cooldown); a success changes nothing (the probe decides)."""
        if self.state == "closed":
            self.record(latency_ms, ok)
            return
        if self.observe is not None:
            self.observe(latency_ms, ok)
        if not ok:
            self.failures += 1
            self.state, self.failing, self.reason = "open", True, "a call failed while open"
            self._opened_at = self.clock()

    def record(self, latency_ms: float, ok: bool = True) -> None:
        """Report one call that `allow()` let through: its latency and whether it succeeded."""
        if self.observe is not None:
            self.observe(latency_ms, ok)
        if not ok:
            self.failures += 1
            latency_ms = max(latency_ms, self.p99_bound_ms * 2)  # a failure counts as slow
        if not math.isfinite(latency_ms) or latency_ms < 0:
            latency_ms = self.p99_bound_ms * 2
        if self.state == "half_open":
            self._probe_out = False
            if ok and latency_ms <= self.p99_bound_ms:
                self._close()
                self._samples.clear()
                self._failed.clear()
                self._over = 0
                self.failing = False
                self._push(latency_ms, not ok)
            else:
                self._open_for(f"probe took {latency_ms:.0f} ms" if ok else "probe failed", failing=not ok)
            return
        self._push(latency_ms, not ok)
        if self.state == "closed" and len(self._samples) >= self.min_calls and self._over:
            p99 = self.p99_ms()
            if p99 is not None and p99 > self.p99_bound_ms:
                self._open_for(f"L3 p99 {p99:.0f} ms > {self.p99_bound_ms:.0f} ms", failing=any(self._failed))

    def _push(self, latency_ms: float, failed: bool) -> None:
        if len(self._samples) == self._samples.maxlen and self._samples[0] > self.p99_bound_ms:
            self._over -= 1  # the oldest sample leaves the window
        self._samples.append(latency_ms)
        self._failed.append(failed)
        self._over += latency_ms > self.p99_bound_ms

    def _open_for(self, reason: str, *, failing: bool) -> None:
        self.failing = failing
        self._open(reason)

    def stats(self) -> LatencyStats:
        return LatencyStats(
            state=self.state,
            p99_ms=self.p99_ms(),
            calls_in_window=len(self._samples),
            opened=self.opened,
            rejected=self.rejected,
            failures=self.failures,
            reason=self.reason,
        )
