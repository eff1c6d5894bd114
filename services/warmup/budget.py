"""Caps on what warmup may load: a token bucket of prefetch bytes per second (in event time), and the
ledger of warmed keys that tells a useful prefetch (read before `useful_within_ms`) from a wasted one
(evicted or never read), per source, so a source whose prefetches keep going to waste can back off."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


class ByteBudget:
    """Token bucket: `rate` bytes per second, bursts up to `burst` bytes."""

    def __init__(self, bytes_per_s: float, burst_bytes: float | None = None) -> None:
        if bytes_per_s <= 0:
            raise ValueError("the prefetch budget must be positive")
        self.rate = bytes_per_s
        self.burst = burst_bytes if burst_bytes is not None else bytes_per_s
        self._tokens = self.burst
        self._at_ms: int | None = None

    def _refill(self, now_ms: int) -> None:
        if self._at_ms is not None and now_ms > self._at_ms:
            self._tokens = min(self.burst, self._tokens + (now_ms - self._at_ms) * self.rate / 1000)
        if self._at_ms is None or now_ms > self._at_ms:
            self._at_ms = now_ms

    def take(self, sizes: list[int], now_ms: int) -> int:
        """How many of `sizes` (in order) fit now; their bytes are spent."""
        self._refill(now_ms)
        n = 0
        for size in sizes:
            if size > self._tokens:
                break
            self._tokens -= size
            n += 1
        return n


@dataclass(slots=True)
class Warmed:
    t_warm_ms: int
    source: str
    size_bytes: int


@dataclass(slots=True)
class Outcomes:
    useful: int = 0
    wasted_evicted: int = 0
    wasted_unread: int = 0

    @property
    def wasted(self) -> int:
        return self.wasted_evicted + self.wasted_unread

    def wasted_share(self) -> float:
        done = self.useful + self.wasted
        return self.wasted / done if done else 0.0


class WarmLedger:
    """Keys warmed and not yet judged, oldest first."""

    def __init__(self, useful_within_ms: int = 60_000, max_keys: int = 100_000) -> None:
        self.useful_within_ms = useful_within_ms
        self.max_keys = max_keys
        self._open: OrderedDict[str, Warmed] = OrderedDict()
        self.outcomes = Outcomes()
        self.bytes_warmed = 0
        self._recent: dict[str, deque[bool]] = {}  # source -> the latest outcomes (True: useful)

    def __contains__(self, key: str) -> bool:
        return key in self._open

    def __len__(self) -> int:
        return len(self._open)

    def warmed(self, key: str, now_ms: int, source: str, size_bytes: int) -> None:
        self._open.pop(key, None)
        self._open[key] = Warmed(now_ms, source, size_bytes)
        self.bytes_warmed += size_bytes
        while len(self._open) > self.max_keys:
            self._open.popitem(last=False)
            self.outcomes.wasted_unread += 1

    def warmed_at(self, key: str) -> int | None:
        w = self._open.get(key)
        return w.t_warm_ms if w is not None else None

    def _judged(self, w: Warmed, useful: bool) -> None:
        recent = self._recent.get(w.source)
        if recent is None:
            recent = self._recent[w.source] = deque(maxlen=200)
        recent.append(useful)

    def recent_wasted_share(self, source: str, min_judged: int = 50) -> float | None:
        """The wasted share of the latest (up to 200) judged prefetches of `source`; None until
        `min_judged` have been judged."""
        recent = self._recent.get(source)
        if recent is None or len(recent) < min_judged:
            return None
        return 1.0 - sum(recent) / len(recent)

    def read(self, key: str) -> Warmed | None:
        w = self._open.pop(key, None)
        if w is not None:
            self.outcomes.useful += 1
            self._judged(w, True)
        return w

    def evicted(self, key: str) -> None:
        w = self._open.pop(key, None)
        if w is not None:
            self.outcomes.wasted_evicted += 1
            self._judged(w, False)

    def expire(self, now_ms: int) -> int:
        n = 0
        while self._open:
            key, w = next(iter(self._open.items()))
            if now_ms - w.t_warm_ms < self.useful_within_ms:
                break
            del self._open[key]
            self.outcomes.wasted_unread += 1
            self._judged(w, False)
            n += 1
        return n
