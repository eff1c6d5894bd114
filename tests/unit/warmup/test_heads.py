"""Head-heat sharding (docs/design.md §3.1): variance over 64 steps, softmax T=0.1, classes with
hysteresis."""

from __future__ import annotations

import numpy as np
import pytest

from services.warmup.heads import QUOTAS, HeadHeat, classify, head_scores


def test_the_most_variable_head_scores_1_and_steady_heads_near_0() -> None:
    rng = np.random.default_rng(0)
    history = np.column_stack([np.full(64, 0.5), rng.normal(0, 0.1, 64), rng.normal(0, 1.0, 64)])
    scores = head_scores(history)
    assert scores.argmax() == 2 and scores[2] == pytest.approx(1.0)
    assert scores[0] < 1e-3
    assert np.all((scores >= 0) & (scores <= 1))


@pytest.mark.parametrize(
    ("score", "previous", "expected"),
    [
        (0.1, None, "cold"),
        (0.3, None, "warm"),
        (0.69, None, "warm"),
        (0.7, None, "hot"),
        (0.32, "cold", "cold"),  # not clearly past 0.3
        (0.36, "cold", "warm"),
        (0.67, "hot", "hot"),
        (0.6, "hot", "warm"),
        (0.27, "warm", "warm"),
        (0.2, "warm", "cold"),
        (0.73, "warm", "warm"),
        (0.8, "warm", "hot"),
    ],
)
def test_classes_and_hysteresis(score: float, previous: str | None, expected: str) -> None:
    assert classify(score, previous, hysteresis=0.05) == expected  # type: ignore[arg-type]


def test_a_head_hovering_at_a_boundary_does_not_flap() -> None:
    flips = 0
    last = None
    for i in range(100):
        score = 0.3 + (0.02 if i % 2 else -0.02)
        now = classify(score, last)
        flips += last is not None and now != last
        last = now
    assert flips == 0


def test_the_rolling_plan_is_published_when_classes_change_and_quotas_follow_the_seed() -> None:
    hh = HeadHeat("m", window_steps=64)
    rng = np.random.default_rng(1)
    hh.observe([0.0, 0.0, 0.0])
    assert hh.plan() is None
    plans = []
    for _ in range(64):
        hh.observe([0.5, float(rng.normal(0, 0.2)), float(rng.normal(0, 2.0))])
        plan = hh.plan()
        if plan is not None:
            plans.append(plan)
    assert plans, "the first plan counts as a change"
    final = plans[-1]
    assert final.classes[2] == "hot" and final.classes[0] == "cold"
    assert final.heads_by_class()["hot"] == [2]
    assert QUOTAS["hot"] == {"vcpu": 8, "memory_gb": 16, "gpu": True}
    assert QUOTAS["cold"]["vcpu"] == 2 and QUOTAS["warm"]["memory_gb"] == 8
    hh.observe([0.1, 0.2])  # another head count: the history starts over
    assert hh.plan() is None
