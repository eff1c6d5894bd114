from __future__ import annotations

from services.heat.policies.minisim import WindowTuner


def feed(tuner: WindowTuner, keys: list[int], rounds: int) -> None:
    for _ in range(rounds):
        for key in keys:
            tuner.record(key)


def test_an_lru_friendly_zigzag_gets_the_whole_cache_as_window() -> None:
    tuner = WindowTuner(50)
    sweep = list(range(200))
    feed(tuner, sweep + sweep[::-1], 15)
    assert tuner.fraction == 1.0


def test_a_loop_keeps_the_window_small() -> None:
    tuner = WindowTuner(50)
    feed(tuner, list(range(80)), 100)
    assert tuner.fraction <= 0.15


def test_large_caches_are_simulated_on_a_sample() -> None:
    tuner = WindowTuner(100_000, max_shadow=1000)
    assert tuner.rate == 0.01
    assert tuner.shadows[0].capacity == 1000
    sampled = sum(tuner.record(k) is None for k in range(1000))
    assert sampled == 1000
