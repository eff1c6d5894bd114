"""Latency spikes (RTT > 320 ms) and the warmup mismatch Delta_t = t_peak - t_warm (docs/design.md §2.5)."""

from __future__ import annotations

import pytest

from schemas.events import CacheAccessed
from streams.spikes import SpikeDetector, warm_start_ms


def rtt(ts: int, ms: float, key: str = "k") -> CacheAccessed:
    return CacheAccessed(event_id=f"{key}{ts}", occurred_at_ms=ts, key=key, hit=False, latency_ms=ms)


@pytest.mark.parametrize(("ms", "spike"), [(0.0, False), (320.0, False), (320.01, True), (900.0, True)])
def test_spike_threshold_is_strictly_above_320_ms(ms: float, spike: bool) -> None:
    assert (SpikeDetector().observe(rtt(1_000, ms), "s0") is not None) is spike


@pytest.mark.parametrize(
    ("warm_at", "peak_at", "delta"),
    [(None, 5_000, None), (4_700, 5_000, 300), (5_200, 5_000, -200), (1_000, 5_000, 4_000)],
)
def test_delta_t_is_peak_minus_last_warm(warm_at: int | None, peak_at: int, delta: int | None) -> None:
    detector = SpikeDetector()
    if warm_at is not None:
        detector.warmed("k", warm_at)
    spike = detector.observe(rtt(peak_at, 400.0), "s0")
    assert spike is not None and spike.delta_t_ms == delta and spike.t_peak_ms == peak_at
    event = spike.event("src-1")
    assert event.delta_t_ms == delta and event.rtt_ms == 400.0 and event.shard == "s0"
    assert event.event_id == spike.event("src-1").event_id != spike.event("src-2").event_id


def test_one_spike_per_key_and_shard_per_cooldown() -> None:
    detector = SpikeDetector(cooldown_ms=1_000)
    seen = [detector.observe(rtt(t, 500.0), "s0") is not None for t in (0, 300, 999, 1_000, 1_500, 2_100)]
    assert seen == [True, False, False, True, False, True]
    assert detector.observe(rtt(300, 500.0, key="other"), "s0") is not None
    assert detector.observe(rtt(300, 500.0), "s1") is not None


def test_warm_times_are_bounded() -> None:
    detector = SpikeDetector(max_keys=2)
    for n, key in enumerate("abc"):
        detector.warmed(key, n)
    spike = detector.observe(rtt(10, 500.0, key="a"), "s0")
    assert spike is not None and spike.t_warm_ms is None


@pytest.mark.parametrize(
    ("request_ms", "p95", "start"), [(1_000, 0.0, 1_000), (1_000, 250.0, 1_300), (0, 100.4, 120)]
)
def test_warm_start_is_request_time_plus_1_2_p95(request_ms: int, p95: float, start: int) -> None:
    assert warm_start_ms(request_ms, p95) == start
