"""The FTL fit (docs/design.md §2.1) and the KV miss-rate estimate with grouped-query attention."""

from __future__ import annotations

import numpy as np
import pytest

from services.warmup.ftl import FtlFit, FtlModels, KvShape, kv_bytes_needed, kv_miss_rate, seed_miss_rate


def test_the_seeds_two_points_give_delta_596_and_base_115() -> None:
    fit = FtlFit()
    fit.observe(0.12, 186.0)
    fit.observe(0.38, 341.0)
    base, delta = fit.params()
    assert delta == pytest.approx(596.15, abs=0.1)
    assert base == pytest.approx(114.46, abs=0.1)


@pytest.mark.parametrize(
    ("base", "delta", "noise"), [(115.0, 596.0, 5.0), (40.0, 1200.0, 20.0), (300, 50, 2)]
)
def test_the_fit_recovers_planted_parameters_from_noisy_points(
    base: float, delta: float, noise: float
) -> None:
    rng = np.random.default_rng(7)
    fit = FtlFit()
    for m in rng.uniform(0, 1, 2000):
        fit.observe(float(m), max(0.0, base + m * delta + rng.normal(0, noise)))
    got_base, got_delta = fit.params()
    assert got_base == pytest.approx(base, rel=0.03, abs=1.0)
    assert got_delta == pytest.approx(delta, rel=0.03, abs=1.0)
    assert fit.predict(0.5) == pytest.approx(base + 0.5 * delta, rel=0.03)


def test_one_miss_rate_is_not_a_fit_and_bad_points_are_refused() -> None:
    fit = FtlFit()
    fit.observe(0.2, 100.0)
    fit.observe(0.2, 120.0)
    assert not fit.fitted
    assert fit.params() == (110.0, 0.0)
    for m, f in [(-0.1, 10.0), (1.5, 10.0), (0.5, -1.0)]:
        with pytest.raises(ValueError):
            fit.observe(m, f)


def test_forgetting_follows_a_shift_and_the_checkpoint_round_trips() -> None:
    models = FtlModels(forget=0.9)
    for i in range(200):
        m = (i % 10) / 10
        models.observe("7b", m, 100 + 500 * m if i < 100 else 200 + 300 * m)
    base, delta = models.fits["7b"].params()
    assert base == pytest.approx(200, abs=2) and delta == pytest.approx(300, abs=3)
    restored = FtlModels()
    restored.load(models.to_dict())
    assert restored.fits["7b"].params() == pytest.approx((base, delta))


def test_grouped_query_attention_counts_kv_heads() -> None:
    # 32 layers, 8 KV heads, head_dim 128, fp16: 128 KiB of K and V per token.
    gqa = KvShape(layers=32, kv_heads=8, head_dim=128, bytes_per_value=2)
    assert gqa.bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072
    seq = 2048
    assert kv_bytes_needed(seq, gqa) == 256 * 1024 * 1024
    capacity = 128 * 1024 * 1024  # half of what 2,048 tokens need
    assert kv_miss_rate(seq, gqa, capacity) == pytest.approx(0.5)
    # The seed's formula counts one head: it needs 1/8 of the bytes, so the same capacity covers it.
    assert seed_miss_rate(seq, gqa, capacity) == 0.0
    assert kv_miss_rate(seq, gqa, 0) == 1.0
    assert kv_miss_rate(seq, gqa, 10 * 1024**3) == 0.0
    # Multi-head attention (kv_heads = heads = 32) needs 4x the GQA figure.
    mha = KvShape(layers=32, kv_heads=32, head_dim=128)
    assert kv_bytes_needed(seq, mha) == 4 * kv_bytes_needed(seq, gqa)
