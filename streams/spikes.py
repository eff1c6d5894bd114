"""Latency spikes and the warmup-window mismatch (docs/design.md §2.5).

A spike is an access whose RTT exceeds 320 ms. The mismatch Delta_t = t_peak - t_warm compares when
the spike hit (t_peak) with when the key was last warmed (t_warm: the latest `KvBlockStored` for it):
positive means the warm load landed before the peak, negative that it came too late, and a large
positive value that it was evicted again before traffic arrived. The design's warmup window is
200-500 ms, and warmup should start at request time + 1.2 * P95 dependency latency (`warm_start_ms`).

One spike event per key and shard per `cooldown_ms` of event time keeps a slow dependency from
flooding the topic.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from schemas.events import CacheAccessed, LatencySpikeDetected

SPIKE_RTT_MS = 320.0
WARMUP_WINDOW_MS = (200, 500)
WARM_START_P95_FACTOR = 1.2


def warm_start_ms(request_ms: int, p95_dependency_latency_ms: float) -> int:
    """When to start warming so the load meets the peak: request time + 1.2 * P95 (docs/design.md §2.5)."""
    return request_ms + round(WARM_START_P95_FACTOR * p95_dependency_latency_ms)


@dataclass(frozen=True, slots=True)
class Spike:
    shard: str
    key: str
    rtt_ms: float
    t_peak_ms: int
    t_warm_ms: int | None

    @property
    def delta_t_ms(self) -> int | None:
        return None if self.t_warm_ms is None else self.t_peak_ms - self.t_warm_ms

    def event(self, source_event_id: str) -> LatencySpikeDetected:
        event_id = hashlib.sha256(f"spike|{source_event_id}".encode()).hexdigest()[:32]
        return LatencySpikeDetected(
            event_id=event_id,
            occurred_at_ms=self.t_peak_ms,
            shard=self.shard,
            key=self.key,
            rtt_ms=self.rtt_ms,
            t_peak_ms=self.t_peak_ms,
            t_warm_ms=self.t_warm_ms,
            delta_t_ms=self.delta_t_ms,
        )


class SpikeDetector:
    """Remembers warm times and recent spikes for a bounded number of keys (oldest forgotten)."""

    def __init__(
        self, threshold_ms: float = SPIKE_RTT_MS, cooldown_ms: int = 1_000, max_keys: int = 100_000
    ) -> None:
        self.threshold_ms = threshold_ms
        self.cooldown_ms = cooldown_ms
        self.max_keys = max_keys
        self._warm: OrderedDict[str, int] = OrderedDict()
        self._last_spike: OrderedDict[tuple[str, str], int] = OrderedDict()

    def warmed(self, key: str, t_ms: int) -> None:
        self._warm[key] = max(t_ms, self._warm.get(key, t_ms))
        self._warm.move_to_end(key)
        if len(self._warm) > self.max_keys:
            self._warm.popitem(last=False)

    def observe(self, access: CacheAccessed, shard: str) -> Spike | None:
        if access.latency_ms <= self.threshold_ms:
            return None
        t = access.occurred_at_ms
        slot = (shard, access.key)
        last = self._last_spike.get(slot)
        if last is not None and abs(t - last) < self.cooldown_ms:
            return None
        self._last_spike[slot] = t
        self._last_spike.move_to_end(slot)
        if len(self._last_spike) > self.max_keys:
            self._last_spike.popitem(last=False)
        return Spike(shard, access.key, access.latency_ms, t, self._warm.get(access.key))
