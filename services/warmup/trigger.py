"""When to warm (docs/design.md §3.3, §2.5): only inside the band 50 < QPS < 200 and
2.1 < entropy < 3.8 bits (below it traffic is too cold to matter, above it too chaotic to predict;
outside, hold and say why), and start the load at request time + 1.2 x P95 of the dependency latency so
it meets the peak.
`DeltaT` measures how well it did: Δt = t_peak - t_warm for every warmup (>= 0: warm before the peak).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Band:
    qps_min: float = 50.0
    qps_max: float = 200.0
    entropy_min_bits: float = 2.1
    entropy_max_bits: float = 3.8


@dataclass(frozen=True, slots=True)
class Verdict:
    warm: bool
    reason: str


def judge(qps: float, entropy_bits: float, band: Band) -> Verdict:
    """Warm inside the open band; otherwise hold, naming the bound that was crossed."""
    if not math.isfinite(qps) or not math.isfinite(entropy_bits):
        return Verdict(False, "hold: window statistics are not finite")
    if qps <= band.qps_min:
        return Verdict(False, f"hold: qps {qps:.1f} <= {band.qps_min:g} (too cold to matter)")
    if qps >= band.qps_max:
        return Verdict(False, f"hold: qps {qps:.1f} >= {band.qps_max:g} (too hot to predict)")
    if entropy_bits <= band.entropy_min_bits:
        return Verdict(
            False, f"hold: entropy {entropy_bits:.2f} <= {band.entropy_min_bits:g} bits (a few keys: cached)"
        )
    if entropy_bits >= band.entropy_max_bits:
        return Verdict(
            False, f"hold: entropy {entropy_bits:.2f} >= {band.entropy_max_bits:g} bits (too chaotic)"
        )
    return Verdict(True, f"warm: qps {qps:.1f} and entropy {entropy_bits:.2f} bits inside the band")


def warm_start_ms(request_ms: int, dependency_p95_ms: float, factor: float = 1.2) -> int:
    """docs/design.md §2.5: shift the load by the P95 dependency latency times a safety factor."""
    return request_ms + round(max(0.0, dependency_p95_ms) * factor)


class LatencyQuantile:
    """P95 (or any quantile) of the last `size` observed dependency latencies."""

    def __init__(self, size: int = 512, q: float = 0.95) -> None:
        self.q = q
        self._values: deque[float] = deque(maxlen=size)

    def observe(self, value_ms: float) -> None:
        if math.isfinite(value_ms) and value_ms >= 0:
            self._values.append(value_ms)

    def value(self, default: float = 0.0) -> float:
        if not self._values:
            return default
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, math.ceil(self.q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class DeltaTSample:
    shard: str
    t_warm_ms: int
    t_peak_ms: int

    @property
    def delta_t_ms(self) -> int:
        return self.t_peak_ms - self.t_warm_ms


class DeltaT:
    """Pairs each warmup of a shard with the peak that follows it: the highest-QPS 1 s window of that
    shard within `horizon_ms` after the warmup. A sample is final once the horizon has passed."""

    def __init__(self, horizon_ms: int = 10_000) -> None:
        self.horizon_ms = horizon_ms
        self._open: dict[str, list[tuple[int, int, float]]] = {}  # shard -> [(t_warm, t_peak, qps)]

    def warmed(self, shard: str, t_warm_ms: int) -> None:
        self._open.setdefault(shard, []).append((t_warm_ms, -1, -1.0))

    def window(self, shard: str, start_ms: int, end_ms: int, qps: float) -> list[DeltaTSample]:
        """Hear a 1 s window; returns the samples whose horizon has closed."""
        pending = self._open.get(shard)
        if not pending:
            return []
        done: list[DeltaTSample] = []
        still: list[tuple[int, int, float]] = []
        for t_warm, t_peak, best in pending:
            if t_warm - 1000 <= start_ms <= t_warm + self.horizon_ms and qps > best:
                t_peak, best = start_ms, qps
            if end_ms > t_warm + self.horizon_ms:
                if t_peak >= 0:
                    done.append(DeltaTSample(shard, t_warm, t_peak))
            else:
                still.append((t_warm, t_peak, best))
        self._open[shard] = still
        return done
