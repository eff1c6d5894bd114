"""Circuit breaker around L3 (DESIGN.md §3 release safety, seed §4.4): open when the P99 latency of the
recent calls exceeds a bound (150 ms in the seed), then serve from L1/L2 only; after a cooldown let one
probe call through (half-open) and close again only when it is fast and succeeds. A call that must not
be refused for slowness alone (a durable write: the client waits for it) still goes while the breaker
is open only because calls are slow (`allow_slow`), not because they fail.

Pure: the caller times each call and reports it; the clock (monotonic ms) is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerStats:
    state: BreakerState
    p99_ms: float | None
    calls_in_window: int
    opened: int
    rejected: int
    failures: int
    reason: str | None


class LatencyBreaker:
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
        self.p99_bound_ms = p99_ms
        self.min_calls = min_calls
        self.cooldown_ms = cooldown_ms
        self.clock = clock
        self._samples: deque[float] = deque(maxlen=window)
        # Samples in the window above the bound: while none is, the P99 cannot be either, so the
        # percentile (tens of microseconds, on every L3 call of a lookup) need not be computed.
        self._over = 0
        self.state: BreakerState = "closed"
        self._opened_at = 0
        self._probe_out = False
        self.failing = False  # opened because calls failed, not only because they were slow
        self._failed: deque[bool] = deque(maxlen=window)  # which samples in the window are failures
        self.opened = 0
        self.rejected = 0
        self.failures = 0
        self.reason: str | None = None
        # Hears every call reported (its latency in ms, whether it succeeded): the latency histogram.
        self.observe: Callable[[float, bool], None] | None = None

    def p99_ms(self) -> float | None:
        if not self._samples:
            return None
        return float(np.percentile(np.fromiter(self._samples, float, len(self._samples)), 99))

    def allow(self) -> bool:
        """May a call go to L3 now? In half-open, exactly one probe is let through at a time."""
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

    def retry_in_ms(self) -> int:
        """How long until a refused call could go (the rest of the cooldown); 0 when it could now."""
        if self.state != "open":
            return 0
        return max(0, self.cooldown_ms - (self.clock() - self._opened_at))

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
                self.state = "closed"
                self.reason = None
                self._samples.clear()
                self._failed.clear()
                self._over = 0
                self.failing = False
                self._push(latency_ms, not ok)
            else:
                self._open(f"probe took {latency_ms:.0f} ms" if ok else "probe failed", failing=not ok)
            return
        self._push(latency_ms, not ok)
        if self.state == "closed" and len(self._samples) >= self.min_calls and self._over:
            p99 = self.p99_ms()
            if p99 is not None and p99 > self.p99_bound_ms:
                self._open(f"L3 p99 {p99:.0f} ms > {self.p99_bound_ms:.0f} ms", failing=any(self._failed))

    def _push(self, latency_ms: float, failed: bool) -> None:
        if len(self._samples) == self._samples.maxlen and self._samples[0] > self.p99_bound_ms:
            self._over -= 1  # the oldest sample leaves the window
        self._samples.append(latency_ms)
        self._failed.append(failed)
        self._over += latency_ms > self.p99_bound_ms

    def _open(self, reason: str, *, failing: bool) -> None:
        self.failing = failing
        self.state = "open"
        self._opened_at = self.clock()
        self.opened += 1
        self.reason = reason

    def stats(self) -> BreakerStats:
        return BreakerStats(
            state=self.state,
            p99_ms=self.p99_ms(),
            calls_in_window=len(self._samples),
            opened=self.opened,
            rejected=self.rejected,
            failures=self.failures,
            reason=self.reason,
        )
