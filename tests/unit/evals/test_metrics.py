"""Metrics on small cases worked out by hand (see each test's comment)."""

from __future__ import annotations

import numpy as np
import pytest

from switchyard.evals import metrics

# Four prompts: the strong model fixes prompts 1 and 2, breaks prompt 3; prompt 0 is easy.
Q_WEAK = np.array([1.0, 0.0, 0.0, 1.0])
Q_STRONG = np.array([1.0, 1.0, 1.0, 0.0])
C_WEAK = np.array([1.0, 1.0, 1.0, 1.0])
C_STRONG = np.array([10.0, 10.0, 10.0, 10.0])
SCORES = np.array([0.1, 0.9, 0.8, 0.2])  # order: 1, 2, 3, 0


def _curve(scores=SCORES):
    return metrics.routing_curve(scores, Q_WEAK, Q_STRONG, C_WEAK, C_STRONG)


def test_quality_and_cost_of_a_decision_vector():
    decisions = np.array([0, 1, 1, 0])
    assert metrics.decision_quality(decisions, Q_WEAK, Q_STRONG) == 1.0  # mean(1, 1, 1, 1)
    assert metrics.decision_cost(decisions, C_WEAK, C_STRONG) == 5.5  # mean(1, 10, 10, 1)


def test_curve_points():
    curve = _curve()
    assert curve.strong_share.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert curve.quality.tolist() == [0.5, 0.75, 1.0, 0.75, 0.75]
    assert curve.cost_usd.tolist() == [1.0, 3.25, 5.5, 7.75, 10.0]
    assert curve.thresholds.tolist() == [np.inf, 0.9, 0.8, 0.2, 0.1]


def test_apgr_by_trapezoids():
    # Qw = 0.5, Qs = 0.75, so PGR = 0, 1, 2, 1, 1; 0.25 * (0.5 + 1.5 + 1.5 + 1) = 1.125
    assert metrics.apgr(_curve(), 0.5, 0.75) == pytest.approx(1.125)


def test_apgr_of_a_constant_score_is_one_half():
    # One tie: the expectation over its order is the straight line from (0, 0) to (1, 1).
    curve = _curve(np.full(4, 0.3))
    assert curve.strong_share.tolist() == [0.0, 1.0]
    assert metrics.apgr(curve, 0.5, 0.75) == pytest.approx(0.5)


def test_apgr_of_random_scores_is_about_one_half():
    rng = np.random.default_rng(7)
    n = 20_000
    q_weak = (rng.random(n) < 0.6).astype(float)
    q_strong = (rng.random(n) < 0.8).astype(float)
    curve = metrics.routing_curve(rng.random(n), q_weak, q_strong, np.ones(n), np.ones(n) * 10)
    assert metrics.apgr(curve, q_weak.mean(), q_strong.mean()) == pytest.approx(0.5, abs=0.03)


def test_cpt_interpolates_the_first_crossing():
    curve = _curve()
    assert metrics.cpt(curve, 0.5, 0.5, 0.75) == pytest.approx(0.125)  # PGR 0 -> 1 over share 0 -> 0.25
    assert metrics.cpt(curve, 0.8, 0.5, 0.75) == pytest.approx(0.2)
    assert np.isnan(metrics.cpt(curve, 2.5, 0.5, 0.75))


def test_cost_at_95_percent_of_strong_quality():
    # target 0.95 * 0.75 = 0.7125, reached 85% of the way from (1, 0.5) to (3.25, 0.75)
    assert metrics.cost_at_quality(_curve(), 0.7125) == pytest.approx(1 + 0.85 * 2.25)


def test_pgr_without_a_gap_is_nan():
    assert np.isnan(metrics.pgr(0.7, 0.8, 0.8))


def test_upper_hull_drops_points_under_the_chord_and_dearer_worse_points():
    xs, ys = metrics.upper_hull(np.array([0, 1, 2, 3]), np.array([0, 0.2, 1, 0.9]))
    assert xs.tolist() == [0, 2]
    assert ys.tolist() == [0, 1]


def test_aiq_is_mean_quality_under_the_hull():
    # hull (1, .5) -> (5.5, 1.0), flat at 1.0 to cost 10: (0.75 * 4.5 + 1.0 * 4.5) / 9 = 0.875
    aiq = metrics.aiq(np.array([1, 10, 5.5]), np.array([0.5, 0.75, 1.0]), 1, 10)
    assert aiq == pytest.approx(0.875, abs=1e-3)


def test_auroc():
    assert metrics.auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert metrics.auroc(np.array([0.5, 0.5]), np.array([1, 0])) == pytest.approx(0.5)
    assert metrics.auroc(np.array([0.9, 0.1]), np.array([1, 0])) == 1.0
    assert np.isnan(metrics.auroc(np.array([0.1, 0.2]), np.array([1, 1])))
