"""The heat MLP: numpy and torch agree, it is deterministic under a seed, and it learns a planted
re-use pattern from labels alone."""

from __future__ import annotations

import numpy as np
import pytest

from policies.learned.features import FEATURES, N_FEATURES
from policies.learned.scorer import HeatScorer, ReuseLabeler, rank_correlation

ATTENTION = FEATURES.index("attention")


def planted(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries with high attention heat come back (label 1); the rest are noise (label 0)."""
    x = rng.random((n, N_FEATURES), dtype=np.float32)
    y = (x[:, ATTENTION] > 0.6).astype(np.float32)
    return x, y


def test_numpy_reference_matches_torch() -> None:
    scorer = HeatScorer(N_FEATURES, seed=3)
    x = np.random.default_rng(0).random((50, N_FEATURES), dtype=np.float32)
    np.testing.assert_allclose(scorer.score(x), scorer.torch_score(x), rtol=1e-5, atol=1e-6)


def test_scores_are_in_unit_interval() -> None:
    scorer = HeatScorer(N_FEATURES)
    s = scorer.score(np.random.default_rng(1).normal(size=(100, N_FEATURES)).astype(np.float32) * 50)
    assert s.min() >= 0.0 and s.max() <= 1.0


def test_deterministic_under_seed() -> None:
    def trained(seed: int) -> np.ndarray:
        scorer = HeatScorer(N_FEATURES, seed=seed)
        x, y = planted(np.random.default_rng(5), 512)
        for xi, yi in zip(x, y, strict=True):
            scorer.observe(xi, float(yi))
        for _ in range(20):
            scorer.train()
        return scorer.score(x[:20])

    np.testing.assert_array_equal(trained(1), trained(1))
    assert not np.array_equal(trained(1), trained(2))


def test_learns_a_planted_reuse_pattern() -> None:
    rng = np.random.default_rng(7)
    scorer = HeatScorer(N_FEATURES, seed=0)
    x, y = planted(rng, 4096)
    for xi, yi in zip(x, y, strict=True):
        scorer.observe(xi, float(yi))
    for _ in range(300):
        scorer.train()
    test_x, test_y = planted(rng, 1000)
    scores = scorer.score(test_x)
    assert ((scores > 0.5) == (test_y == 1)).mean() > 0.95
    assert scores[test_y == 1].mean() > 0.8 > 0.2 > scores[test_y == 0].mean()


def test_labeler_grades_reuse_within_the_horizon() -> None:
    scorer = HeatScorer(N_FEATURES)
    labeler = ReuseLabeler(horizon=100)
    row = np.zeros(N_FEATURES, dtype=np.float32)
    labeler.watch("soon", row, tick=0)
    labeler.watch("late", row, tick=0)
    labeler.watch("never", row, tick=0)
    labeler.watch("soon", row, tick=5)  # one pending sample per key
    labeler.heard("soon", 1, scorer)
    labeler.heard("late", 150, scorer)
    labeler.expire(200, scorer)
    assert scorer.labels_seen == 3
    assert labeler.label(1) > labeler.label(50) > labeler.label(100) == 0.0
    assert labeler.label(101) == 0.0
    assert ReuseLabeler(10, graded=False).label(9) == 1.0


def test_rank_correlation() -> None:
    assert rank_correlation(np.array([1.0, 2, 3]), np.array([0.1, 0.2, 0.3])) > 0.99
    assert rank_correlation(np.ones(3), np.array([0.0, 1, 2])) == 0.0


def test_the_prior_columns_match_the_full_features() -> None:
    from policies.learned.features import EntryTable

    table = EntryTable(8, 8)
    table.used[:5] = True
    table.last_tick[:5] = [1, 5, 9, 20, 40]
    table.freq[:5] = [1, 3, 7, 15, 2]
    table.freq_epoch[:5] = [0, 1, 2, 2, 0]
    idx = np.arange(5)
    full = table.features(idx, 50, 0, np.ones(5, dtype=bool), resets=2)
    rf = table.recency_frequency(idx, 50, resets=2)
    np.testing.assert_allclose(rf[:, 0], full[:, FEATURES.index("recency")])
    np.testing.assert_allclose(rf[:, 1], full[:, FEATURES.index("frequency")])


def test_an_ablated_feature_group_is_invisible_to_the_model() -> None:
    from policies.learned.features import FEATURE_GROUPS, keep_mask

    keep = keep_mask(["attention"])
    assert keep is not None
    zeroed = {FEATURES[i] for i in np.nonzero(keep == 0)[0]}
    assert zeroed == set(FEATURE_GROUPS["attention"])
    assert keep_mask([]) is None
    scorer = HeatScorer(N_FEATURES, seed=3, keep=keep)
    rng = np.random.default_rng(4)
    x, y = planted(rng, 512)
    shuffled = x.copy()
    shuffled[:, ATTENTION] = rng.random(len(x))  # what the model cannot see may change freely
    np.testing.assert_array_equal(scorer.score(x), scorer.score(shuffled))
    np.testing.assert_allclose(scorer.score(x), scorer.torch_score(shuffled), rtol=1e-5, atol=1e-6)
    for row, label in zip(x, y, strict=True):
        scorer.observe(row, float(label))
    scorer.train(50)
    # the planted signal is attention: with it zeroed the model cannot rank by it
    assert abs(rank_correlation(scorer.score(x), y)) < 0.2


def test_an_unknown_feature_group_is_refused() -> None:
    from policies.learned.features import keep_mask

    with pytest.raises(ValueError, match="unknown feature group"):
        keep_mask(["colour"])
