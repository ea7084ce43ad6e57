from __future__ import annotations

import math

import numpy as np
import pytest

from switchyard.cascade.confidence import (
    FEATURE_NAMES,
    FeatureScorer,
    TokenEvidence,
    evidence_from_trace,
    feature_matrix,
    features,
    fit_logistic,
    score,
    scorer_from_dict,
)


def _f(evidence: TokenEvidence, first_k: int = 16) -> dict[str, float]:
    return dict(zip(FEATURE_NAMES, features(evidence, first_k), strict=True))


def test_logprob_statistics_by_hand():
    f = _f(TokenEvidence([-0.1, -0.2, -3.0, -0.1]), first_k=2)
    assert f["mean_logprob"] == pytest.approx(-3.4 / 4)
    assert f["min_logprob"] == -3.0
    assert f["sum_logprob"] == pytest.approx(-3.4)
    assert f["first_mean_logprob"] == pytest.approx(-0.15)
    assert f["first_min_logprob"] == -0.2
    assert f["log_length"] == pytest.approx(math.log(5))
    assert f["p10_logprob"] == pytest.approx(np.percentile([-0.1, -0.2, -3.0, -0.1], 10))


def test_entropy_and_margin_from_the_top_alternatives():
    half = math.log(0.5)
    even = _f(TokenEvidence([half], [[half, half]]))
    assert even["mean_entropy"] == pytest.approx(math.log(2))
    assert even["mean_margin"] == pytest.approx(0.0)
    sure = _f(TokenEvidence([math.log(0.9)], [[math.log(0.9), math.log(0.05)]]))
    assert sure["mean_margin"] == pytest.approx(0.85)
    assert sure["mean_entropy"] < even["mean_entropy"]


def test_without_alternatives_the_rest_of_the_mass_is_one_bucket():
    f = _f(TokenEvidence([math.log(0.8)]))
    assert f["mean_margin"] == pytest.approx(0.6)
    assert f["mean_entropy"] == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))


def test_one_token_is_enough_and_no_tokens_cannot_be_judged():
    scorer = FeatureScorer("p10_logprob")
    assert score(scorer, evidence_from_trace([-0.7], None)) == pytest.approx(-0.7)
    assert evidence_from_trace([], None) is None
    assert score(scorer, None) is None
    assert np.isnan(feature_matrix([None])).all()


def test_entropy_is_signed_so_that_higher_is_more_confident():
    scorer = FeatureScorer("mean_entropy")
    sure = TokenEvidence([-0.01], [[-0.01, -6.0]])
    unsure = TokenEvidence([-0.7], [[-0.7, -0.7]])
    assert score(scorer, sure) > score(scorer, unsure)


def test_completions_style_top_logprobs_are_read_too():
    evidence = evidence_from_trace([-0.2], [{" A": -0.2, " B": -2.0}])
    assert evidence.top == [[-0.2, -2.0]]


def test_the_learned_scorer_separates_and_round_trips():
    rng = np.random.default_rng(0)
    good = [TokenEvidence(list(rng.normal(-0.2, 0.1, 10))) for _ in range(60)]
    bad = [TokenEvidence(list(rng.normal(-1.5, 0.5, 10))) for _ in range(60)]
    matrix = feature_matrix(good + bad)
    labels = np.array([1] * 60 + [0] * 60)
    scorer = fit_logistic(matrix, labels)
    probs = scorer.score_matrix(matrix)
    assert probs[:60].mean() > 0.8 and probs[60:].mean() < 0.2
    again = scorer_from_dict(scorer.to_dict())
    assert np.allclose(again.score_matrix(matrix), probs, atol=1e-6)


def test_scorer_files_from_another_feature_set_are_refused():
    raw = {"kind": "logistic", "features": ["mean_logprob"], "mean": [0], "scale": [1], "coef": [1], "intercept": 0}
    with pytest.raises(ValueError, match="Re-run `switchyard eval cascade`"):
        scorer_from_dict(raw)
    with pytest.raises(ValueError, match="unknown confidence feature"):
        scorer_from_dict({"kind": "feature", "feature": "vibes"})
