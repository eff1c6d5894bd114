"""Degrade to local-only (docs/design.md §4.4): the state machine that watches a node's hit rate over a
sliding time window and says when to serve local-only, i.e. without other nodes' L2, the one remote read
on the request path, which only adds latency when the cache is not paying (docs/tiers.md).

Parameters (settings `CACHEMESH_TIERS_DEGRADE_*`): `window_ms` (30 s) of per-tick counts; `normal` ->
`local_only` below `enter_below` (0.85); back once the rate has stayed at or above `exit_at` (0.90) for
`hold_ms` (10 s): that gap and the hold are the hysteresis, so a rate wandering around 85% does not flap.
No change within `min_dwell_ms` of the last, nor on fewer than `min_lookups` lookups in the window or
before one whole window (without that evidence a recovery's hold starts again).
Pure: fed counts (`observe`), the clock (monotonic ms) passed in. Every change says why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Mode = Literal["normal", "local_only"]


@dataclass(frozen=True, slots=True)
class DegradeConfig:
    window_ms: int = 30_000
    enter_below: float = 0.85
    exit_at: float = 0.90
    hold_ms: int = 10_000
    min_dwell_ms: int = 30_000
    min_lookups: int = 200

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise ValueError("window_ms must be positive")
        if not 0.0 <= self.enter_below <= self.exit_at <= 1.0:
            raise ValueError("need 0 <= enter_below <= exit_at <= 1 (exit_at above enter_below: hysteresis)")
        if self.hold_ms < 0 or self.min_dwell_ms < 0 or self.min_lookups < 1:
            raise ValueError("hold_ms and min_dwell_ms must be >= 0, min_lookups >= 1")


@dataclass(frozen=True, slots=True)
class ModeChange:
    """One change of mode and why (published as `TierModeChanged`)."""

    mode: Mode
    previous: Mode
    at_ms: int  # the guard's clock (monotonic)
    hit_rate: float  # over the window, when the change was decided
    hits: int
    lookups: int
    reason: str
    in_previous_ms: int  # how long the node was in `previous`
    local_only_ms: int  # all time spent local-only so far, the period just ended included
    changes: int  # changes so far, this one included


@dataclass(frozen=True, slots=True)
class DegradeStats:
    mode: Mode
    in_mode_ms: int
    window_ms: int
    window_hits: int
    window_lookups: int
    window_hit_rate: float | None
    # While local-only: how long the rate has held at exit_at or above (None: it has not).
    holding_ms: int | None
    local_only_ms: int
    changes: int
    reason: str | None  # why the last change happened
    enter_below: float
    exit_at: float
    hold_ms: int
    min_lookups: int


class HitRateGuard:
    """Normal or local-only, from the hit rate over the last `window_ms`; `observe` once per tick."""

    def __init__(self, config: DegradeConfig, *, clock: Callable[[], int]) -> None:
        self.config = config
        self.clock = clock
        self.mode: Mode = "normal"
        self._samples: deque[tuple[int, int, int]] = deque()  # (at_ms, hits, lookups), oldest first
        self._hits = 0
        self._lookups = 0
        # Counts fed at the first tick are of lookups since now: the first whole window ends window_ms on.
        self._started_ms = clock()
        self._changed_ms: int | None = None
        self._mode_since_ms = clock()
        self._good_since_ms: int | None = None
        self._local_only_ms = 0  # closed local-only periods
        self.changes = 0
        self.reason: str | None = None

    @property
    def local_only(self) -> bool:
        return self.mode == "local_only"

    def observe(self, hits: int, lookups: int) -> ModeChange | None:
        """Count `lookups` (of which `hits` hit) done since the last call, and decide; the change, if any."""
        if lookups < 0 or not 0 <= hits <= lookups:
            raise ValueError(f"need 0 <= hits <= lookups, got {hits} of {lookups}")
        now = self.clock()
        if lookups:
            self._samples.append((now, hits, lookups))
            self._hits += hits
            self._lookups += lookups
        self._prune(now)
        return self._decide(now)

    def _prune(self, now: int) -> None:
        edge = now - self.config.window_ms
        while self._samples and self._samples[0][0] <= edge:
            _, hits, lookups = self._samples.popleft()
            self._hits -= hits
            self._lookups -= lookups

    def _decide(self, now: int) -> ModeChange | None:
        cfg, n, h = self.config, self._lookups, self._hits
        if n < cfg.min_lookups or now - self._started_ms < cfg.window_ms:
            self._good_since_ms = None  # no evidence: a recovery's hold starts again
            return None
        rate = h / n
        dwelt = self._changed_ms is None or now - self._changed_ms >= cfg.min_dwell_ms
        window = f"{rate:.1%} over the last {cfg.window_ms} ms ({h} hits in {n} lookups)"
        if self.mode == "normal":
            if rate < cfg.enter_below and dwelt:
                return self._change("local_only", now, rate, f"hit rate {window} < {cfg.enter_below:.0%}")
            return None
        if rate < cfg.exit_at:
            self._good_since_ms = None
            return None
        if self._good_since_ms is None:
            self._good_since_ms = now
        held = now - self._good_since_ms
        if held >= cfg.hold_ms and dwelt:
            reason = f"hit rate {window} >= {cfg.exit_at:.0%}, held for {held} ms"
            return self._change("normal", now, rate, reason)
        return None

    def _change(self, mode: Mode, now: int, rate: float, reason: str) -> ModeChange:
        previous, in_previous = self.mode, now - self._mode_since_ms
        if previous == "local_only":
            self._local_only_ms += in_previous
        self.mode, self._mode_since_ms, self._changed_ms = mode, now, now
        self._good_since_ms = None
        self.changes += 1
        self.reason = reason
        return ModeChange(
            mode=mode,
            previous=previous,
            at_ms=now,
            hit_rate=rate,
            hits=self._hits,
            lookups=self._lookups,
            reason=reason,
            in_previous_ms=in_previous,
            local_only_ms=self._local_only_ms,
            changes=self.changes,
        )

    def local_only_ms(self) -> int:
        """All time spent local-only, the current period included."""
        now = self.clock()
        return self._local_only_ms + (now - self._mode_since_ms if self.local_only else 0)

    def stats(self) -> DegradeStats:
        now = self.clock()
        self._prune(now)
        cfg = self.config
        return DegradeStats(
            mode=self.mode,
            in_mode_ms=now - self._mode_since_ms,
            window_ms=cfg.window_ms,
            window_hits=self._hits,
            window_lookups=self._lookups,
            window_hit_rate=self._hits / self._lookups if self._lookups else None,
            holding_ms=None if self._good_since_ms is None else now - self._good_since_ms,
            local_only_ms=self.local_only_ms(),
            changes=self.changes,
            reason=self.reason,
            enter_below=cfg.enter_below,
            exit_at=cfg.exit_at,
            hold_ms=cfg.hold_ms,
            min_lookups=cfg.min_lookups,
        )
