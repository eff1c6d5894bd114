import numpy as np
import pytest

from bench._pair_verifier import FEATURES, Verifier, auc, features


def _f(name: str, cached: str, request: str, similarity: float = 0.9) -> float:
    return float(features(cached, request, similarity)[FEATURES.index(name)])


def test_auc_counts_pairs_ranked_right_and_ties_as_half() -> None:
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 1.0
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), np.array([0, 0, 1, 1])) == 0.0
    assert auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5
    assert auc(np.array([0.3, 0.1, 0.2]), np.array([1, 0, 0])) == 1.0
    assert np.isnan(auc(np.array([0.3]), np.array([1])))


def test_word_order_signal_sees_a_swap_and_not_a_paraphrase() -> None:
    assert _f("order", "flights from Paris to Rome", "flights from Rome to Paris") == 1 / 3
    assert _f("order", "Paris beats Rome", "Rome beats Paris") == 1.0
    assert _f("order", "flights from Paris to Rome", "cheap flights from Paris to Rome") == 0.0


def test_overlap_length_question_word_and_containment_signals() -> None:
    assert _f("content_jaccard", "reset my password", "reset my password") == 1.0
    assert _f("content_jaccard", "reset my password", "bake bread") == 0.0
    assert _f("length_ratio", "a b", "a b") == 0.0
    assert _f("question_word_differs", "How do I cook rice?", "Why do I cook rice?") == 1.0
    assert _f("question_word_differs", "How do I cook rice?", "How can I cook rice?") == 0.0
    assert _f("contained", "cook rice", "cook rice quickly") == 1.0
    assert _f("quantities_differ", "a 5 kg bag", "a 10 kg bag") == 1.0
    assert _f("negation_gap", "it works", "it does not work") == 1.0


def test_fit_recovers_the_direction_of_a_planted_model_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, len(FEATURES)))
    p = 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0 * x[:, 5])))
    y = (rng.random(4000) < p).astype(int)
    model = Verifier.fit(x, y)
    assert model.weights[0] > 1.5 and model.weights[5] < -0.7
    assert abs(model.weights[1]) < 0.2
    assert auc(model.score_features(x), y) > 0.8
    again = Verifier.from_dict(model.to_dict())
    assert np.allclose(again.score_features(x[:5]), model.score_features(x[:5]))


def test_weights_fitted_on_other_features_are_refused() -> None:
    data = Verifier.fit(np.eye(len(FEATURES)), np.array([0, 1] * (len(FEATURES) // 2) + [1])).to_dict()
    data["features"] = ["u"]
    with pytest.raises(ValueError, match="other features"):
        Verifier.from_dict(data)
