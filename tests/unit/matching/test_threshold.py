import math
import random

import numpy as np
import pytest

from matching.threshold import EntryThreshold, ThresholdLearner, wilson_upper

GRID = np.linspace(0.5, 1.0, 50_001)


def planted(s: float, boundary: float = 0.9, slope: float = 4.0) -> float:
    """P(correct | s) of the synthetic world: 50% at `boundary`, logistic in -ln(1 - s)."""
    u = -math.log1p(-min(s, 0.9999))
    return 1 / (1 + math.exp(-slope * (u - -math.log1p(-boundary))))


def best_fixed(delta: float) -> float:
    """The lowest threshold whose served error (s uniform on [0.5, 1]) is at most δ: the planted truth."""
    wrong = np.array([1 - planted(s) for s in GRID])
    served_error = np.cumsum(wrong[::-1])[::-1] / np.arange(len(GRID), 0, -1)
    return float(GRID[np.flatnonzero(served_error <= delta)[0]])


def served_error(t: float) -> float:
    above = GRID[GRID >= t]
    return float(np.mean([1 - planted(s) for s in above]))


def test_wilson_upper_bound() -> None:
    assert wilson_upper(np.array([0.0]), np.array([0.0]), 1.645)[0] == 1.0
    # 0 errors in 133 is the classic "rule of three"-like bound near 2% at one-sided 95%.
    assert wilson_upper(np.array([0.0]), np.array([133.0]), 1.645)[0] == pytest.approx(0.02, abs=0.001)
    assert wilson_upper(np.array([0.05]), np.array([1e6]), 1.645)[0] == pytest.approx(0.05, abs=0.001)


@pytest.mark.parametrize("delta", [0.02, 0.05])
def test_converges_to_a_planted_boundary(delta: float) -> None:
    rng = random.Random(0)
    learner = ThresholdLearner(delta=delta, explore_floor=0.5)
    for _ in range(20_000):
        s = rng.uniform(0.5, 1.0)
        learner.observe(EntryThreshold(), s, rng.random() < planted(s), explored=True)
    serve, _ = learner.thresholds(None)
    truth = best_fixed(delta)
    # Never below the truth by more than a grid step (the bound is an upper one), and close above it.
    assert truth - 0.005 <= serve <= truth + 0.015
    assert served_error(serve) <= delta + 0.002


@pytest.mark.parametrize(("delta", "share"), [(0.01, 0.2), (0.02, 0.5), (0.05, 0.5)])
def test_served_wrong_rate_stays_below_delta_and_it_serves(delta: float, share: float) -> None:
    """A stream of fresh entries, ratings on half of what is served, explorations below the threshold.

    Bar: it serves at least `share` of what the best fixed threshold in hindsight would serve on the
    same stream (the best any similarity rule can do without knowing the labels in advance). The
    bound needs about 1/δ labels above the threshold before it certifies it, so at δ = 1% most of a
    20,000-request stream goes by learning: the bar there is a fifth, at 2% and 5% a half."""
    rng = random.Random(1)
    learner = ThresholdLearner(delta=delta)
    n, served, wrong = 20_000, 0, 0
    for _ in range(n):
        entry = EntryThreshold()
        s = rng.uniform(0.5, 1.0)
        correct = rng.random() < planted(s)
        a = learner.assess(entry, s, rng.random())
        if a.action == "serve":
            learner.note_served()
            served += 1
            wrong += not correct
            if rng.random() < 0.5:
                learner.observe(entry, s, correct)
        elif a.action == "explore":
            learner.observe(entry, s, correct, explored=True)
    hindsight = n * (1.0 - best_fixed(delta)) / 0.5
    assert served >= share * hindsight
    assert wrong / served <= delta


def test_a_cold_pool_serves_nothing_by_similarity_and_explores() -> None:
    # What the node does not know counts as risk: not even a near-identical prompt is served cold.
    learner = ThresholdLearner(delta=0.02)
    assert learner.cold and learner.thresholds(None)[0] == math.inf
    assert learner.assess(None, 0.999, 0.99).action == "miss"
    assert learner.assess(None, 0.999, 0.0).action == "explore"
    assessment = learner.assess(None, 0.95, 0.99)
    assert "cold: 0 of 20 labels" in assessment.reason
    # Once evidence says so (many right answers above 0.9, a few wrong below), it serves there.
    for i in range(400):
        learner.observe(EntryThreshold(), 0.9 + 0.099 * (i % 100) / 100, True, explored=True)
        learner.observe(EntryThreshold(), 0.6 + 0.2 * (i % 100) / 100, False, explored=True)
    assert not learner.cold
    serve_from = learner.thresholds(None)[0]
    assert 0.8 <= serve_from <= 0.95
    assert learner.assess(None, 0.97, 0.99).action == "serve"


def test_a_cold_threshold_set_by_the_deployment_serves_a_cold_pool() -> None:
    learner = ThresholdLearner(cold_threshold=0.97)
    assert learner.cold
    assert learner.assess(None, 0.975, 0.99).action == "serve"
    assert learner.assess(None, 0.96, 0.99).action == "miss"
    assert learner.assess(None, 0.96, 0.0).action == "explore"
    assert learner.assess(None, 0.3, 0.0).action == "miss"


def test_warm_learner_without_a_certified_threshold_serves_nothing_and_explores() -> None:
    learner = ThresholdLearner(delta=0.02)
    for _ in range(50):  # half wrong everywhere: no similarity can be trusted
        learner.observe(EntryThreshold(), 0.99, False, explored=True)
        learner.observe(EntryThreshold(), 0.99, True, explored=True)
    assert not learner.cold
    assert learner.thresholds(None)[0] == math.inf
    assert learner.assess(None, 0.999, 0.99).action == "miss"
    assert learner.assess(None, 0.999, 0.0).action == "explore"


def test_entry_labels_move_its_own_threshold() -> None:
    rng = random.Random(2)
    learner = ThresholdLearner(delta=0.05, explore_floor=0.5)
    for _ in range(5000):
        s = rng.uniform(0.6, 0.999)
        learner.observe(EntryThreshold(), s, rng.random() < planted(s), explored=True)
    pooled = learner.thresholds(EntryThreshold())[0]
    assert pooled < 0.96
    strict = EntryThreshold()
    learner.observe(strict, 0.96, False)  # this entry is wrong even where others are right
    assert learner.thresholds(strict)[0] > 0.96
    assert learner.assess(strict, 0.96, 0.99).action == "miss"
    assert learner.assess(strict, 0.965, 0.99).action == "serve"
    right = EntryThreshold()
    learner.observe(right, 0.95, True)  # right answers never loosen it below the pooled bound
    assert learner.thresholds(right)[0] == pytest.approx(pooled, abs=0.005)


def test_rarely_sampled_labels_weigh_more() -> None:
    """Ratings of 1 in 10 served answers count ten times: the bound follows what was served, not the
    share of it that was rated."""
    learner = ThresholdLearner(delta=0.05, explore_rate=1.0, explore_floor=0.9)
    for _ in range(300):
        learner.observe(EntryThreshold(), 0.95, True, explored=True)
    for _ in range(100):
        learner.note_served()
    for i in range(10):
        learner.observe(EntryThreshold(), 0.99, i > 2)  # 3 of 10 rated wrong
    # Weighted, 30 of ~400 served from 0.95 were wrong (7.5%): nothing is certified at δ = 5%.
    assert learner.thresholds(None)[0] == math.inf
    # Had every served answer been rated, 3 of 310 (1%) would certify everything from the floor.
    all_rated = ThresholdLearner.from_dict(
        {**learner.to_dict(), "served": 10}, explore_rate=1.0, explore_floor=0.9
    )
    assert all_rated.thresholds(None)[0] == pytest.approx(0.9)


def test_state_round_trips() -> None:
    learner = ThresholdLearner(delta=0.05)
    entry = EntryThreshold()
    for s, c in [(0.9, True), (0.8, False)] * 15:
        learner.observe(entry, s, c, explored=s < 0.85)
    learner.note_served()
    again = EntryThreshold.from_dict(entry.to_dict())
    assert (again.sims, again.labels) == (entry.sims, entry.labels)
    restored = ThresholdLearner.from_dict(learner.to_dict())
    assert restored.delta == 0.05
    assert (restored.served, restored.rated) == (learner.served, learner.rated)
    assert restored.thresholds(again) == pytest.approx(learner.thresholds(entry))


@pytest.mark.parametrize("model", ["sigmoid", "sigmoid-point"])
@pytest.mark.parametrize("delta", [0.02, 0.05])
def test_pooled_sigmoid_converges_to_a_planted_boundary(model: str, delta: float) -> None:
    """The planted curve is a sigmoid in -ln(1 - s), so the fit recovers it: the served-error bound ends
    at the best fixed threshold, the pointwise one (stricter) where P(wrong | t) itself reaches δ."""
    rng = random.Random(0)
    learner = ThresholdLearner(delta=delta, explore_floor=0.5, model=model)  # type: ignore[arg-type]
    for _ in range(20_000):
        s = rng.uniform(0.5, 1.0)
        learner.observe(EntryThreshold(), s, rng.random() < planted(s), explored=True)
    serve, _ = learner.thresholds(None)
    if model == "sigmoid":
        truth = best_fixed(delta)
    else:
        truth = float(GRID[np.flatnonzero([1 - planted(s) <= delta for s in GRID])[0]])
    assert truth - 0.005 <= serve <= truth + 0.015
    assert served_error(serve) <= delta + 0.002


@pytest.mark.parametrize("model", ["sigmoid", "sigmoid-point"])
@pytest.mark.parametrize("delta", [0.01, 0.02, 0.05])
def test_pooled_sigmoid_respects_delta_on_a_stream(model: str, delta: float) -> None:
    """The stream of test_served_wrong_rate_stays_below_delta_and_it_serves; the parametric bound needs
    fewer labels than the count bound, so it serves at least as much as that test's bar (half of it at
    1%, where 268 labels must lie above a threshold first). What the bound holds is the error rate of
    what was served, P(wrong | s) summed over it (the draws' own luck aside)."""
    rng = random.Random(1)
    learner = ThresholdLearner(delta=delta, model=model)  # type: ignore[arg-type]
    n, served, wrong, expected = 20_000, 0, 0, 0.0
    for _ in range(n):
        entry = EntryThreshold()
        s = rng.uniform(0.5, 1.0)
        correct = rng.random() < planted(s)
        a = learner.assess(entry, s, rng.random())
        if a.action == "serve":
            learner.note_served()
            served += 1
            wrong += not correct
            expected += 1 - planted(s)
            if rng.random() < 0.5:
                learner.observe(entry, s, correct)
        elif a.action == "explore":
            learner.observe(entry, s, correct, explored=True)
    hindsight = n * (1.0 - best_fixed(delta)) / 0.5
    assert served >= (0.1 if delta < 0.02 else 0.2) * hindsight
    assert expected / served <= delta
    assert wrong / served <= 1.5 * delta


def test_a_pool_where_similarity_does_not_help_certifies_nothing_under_the_sigmoid() -> None:
    learner = ThresholdLearner(delta=0.05, model="sigmoid")
    rng = random.Random(3)
    for _ in range(2000):
        learner.observe(EntryThreshold(), rng.uniform(0.7, 1.0), rng.random() < 0.8, explored=True)
    assert learner.thresholds(None)[0] == math.inf


def warm(learner: ThresholdLearner) -> float:
    """Labels that certify a threshold between 0.8 and 0.95; returns it."""
    for i in range(400):
        learner.observe(EntryThreshold(), 0.9 + 0.099 * (i % 100) / 100, True, explored=True)
        learner.observe(EntryThreshold(), 0.6 + 0.2 * (i % 100) / 100, False, explored=True)
    return learner.thresholds(None)[0]


def test_a_share_of_would_be_hits_is_verified_once_warm_and_weighs_one() -> None:
    learner = ThresholdLearner(delta=0.02, explore_rate=0.5, verify_rate=0.05)
    assert not learner.verifies(0.0)  # cold: nothing is served by similarity, so nothing to verify
    serve_from = warm(learner)
    assert 0.8 <= serve_from <= 0.95
    assert learner.verifies(0.04) and not learner.verifies(0.05)
    assert not ThresholdLearner(verify_rate=0.0).verifies(0.0)
    before = len(learner.pool_sims)
    learner.observe(EntryThreshold(), 0.99, True, explored=True)  # above the threshold: a verification
    learner.observe(EntryThreshold(), 0.75, False, explored=True)  # below it: an exploration
    assert learner.pool_verified[before:] == [True, False]
    sims, _, w = learner.weighted_pool()
    assert w[sims == 0.99].tolist() == [1.0]  # every unserved would-be hit was verified: weight 1
    assert set(w[sims == 0.75].tolist()) == {2.0}  # one miss in 1 / explore_rate explored
    restored = ThresholdLearner.from_dict(learner.to_dict(), explore_rate=0.5)
    assert restored.pool_verified == learner.pool_verified
    assert ThresholdLearner.from_dict(
        {"delta": 0.02, "pool_sims": [0.9], "pool_labels": [1]}
    ).pool_verified == [False]
    with pytest.raises(ValueError, match="verify_rate"):
        ThresholdLearner(verify_rate=1.0)
