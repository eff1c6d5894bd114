"""The warmup band (docs/design.md §3.3), the start time (§2.5) and Δt pairing, on table cases."""

from __future__ import annotations

import pytest

from services.warmup.trigger import Band, DeltaT, LatencyQuantile, judge, warm_start_ms


@pytest.mark.parametrize(
    ("qps", "entropy", "warm", "says"),
    [
        (120, 3.0, True, "inside the band"),
        (50, 3.0, False, "qps 50.0 <= 50"),
        (49.9, 3.0, False, "too cold"),
        (200, 3.0, False, "qps 200.0 >= 200"),
        (120, 2.1, False, "entropy 2.10 <= 2.1"),
        (120, 3.8, False, "too chaotic"),
        (51, 2.11, True, "warm"),
        (float("nan"), 3.0, False, "not finite"),
    ],
)
def test_the_band_warms_only_inside_and_says_why(qps: float, entropy: float, warm: bool, says: str) -> None:
    verdict = judge(qps, entropy, Band())
    assert verdict.warm is warm
    assert says in verdict.reason


def test_the_band_is_configurable() -> None:
    assert judge(20, 1.0, Band(qps_min=10, entropy_min_bits=0.5)).warm
    assert not judge(20, 1.0, Band()).warm


@pytest.mark.parametrize(
    ("t", "p95", "start"), [(1000, 100, 1120), (1000, 0, 1000), (0, 250, 300), (5, -3, 5)]
)
def test_start_is_request_time_plus_1_2_p95(t: int, p95: float, start: int) -> None:
    assert warm_start_ms(t, p95) == start


def test_latency_quantile() -> None:
    q = LatencyQuantile(size=100)
    assert q.value(default=7.0) == 7.0
    for v in range(1, 101):
        q.observe(float(v))
    q.observe(float("inf"))
    assert q.value() == 95.0


def test_delta_t_pairs_a_warmup_with_the_peak_window_that_follows() -> None:
    d = DeltaT(horizon_ms=5000)
    d.warmed("s0", 10_000)
    qps = {9_000: 80, 10_000: 90, 11_000: 150, 12_000: 300, 13_000: 120, 14_000: 60, 15_000: 40}
    closed_at = {}
    for start, q in qps.items():
        for sample in d.window("s0", start, start + 1000, q):
            closed_at[start] = sample.delta_t_ms
    # The peak (12 s) is 2 s after the warmup; the sample closes with the first window past 15 s.
    assert closed_at == {15_000: 2000}
    assert d.window("s0", 16_000, 17_000, 10) == []
    assert d.window("s1", 0, 1000, 5) == []


def test_a_peak_before_the_warmup_gives_a_negative_delta_t() -> None:
    d = DeltaT(horizon_ms=2000)
    d.warmed("s", 10_000)
    out = d.window("s", 9_000, 10_000, 500) + d.window("s", 10_000, 11_000, 100)
    out += d.window("s", 13_000, 14_000, 1)
    assert [s.delta_t_ms for s in out] == [-1000]
