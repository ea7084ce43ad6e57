"""Drift: the PSI against a hand computation, binning at the edges, the reference block, and the
per-process monitor (file reference, warm-up fallback, rates)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from switchyard.core.drift import (
    CASCADE_CONFIDENCE,
    CLASSIFIER_SCORE,
    EPSILON,
    DriftMonitor,
    bin_counts,
    psi,
    quantile_edges,
)
from switchyard.core.thresholds import DriftReference
from switchyard.evals.drift_reference import escalation_reference, reference_block, strong_share_reference


def test_psi_matches_a_hand_computation() -> None:
    # reference half and half; observed 3 of 4 in the first bin:
    # (0.75 - 0.5) ln(0.75 / 0.5) + (0.25 - 0.5) ln(0.25 / 0.5) = 0.101366 + 0.173287
    assert psi([0.5, 0.5], [3, 1]) == pytest.approx(0.274653, abs=1e-6)
    assert psi([0.2, 0.3, 0.5], [20, 30, 50]) == 0.0


def test_an_empty_bin_counts_as_epsilon() -> None:
    # (1 - 0.5) ln 2 + (1e-4 - 0.5) ln(1e-4 / 0.5)
    expected = 0.5 * math.log(2) + (EPSILON - 0.5) * math.log(EPSILON / 0.5)
    assert psi([0.5, 0.5], [4, 0]) == pytest.approx(expected)
    assert psi([1.0, 0.0], [1, 1]) > 2  # a bin the reference never saw: large, finite


def test_psi_refuses_no_values_or_other_bins() -> None:
    with pytest.raises(ValueError):
        psi([0.5, 0.5], [0, 0])
    with pytest.raises(ValueError):
        psi([0.5, 0.5], [1, 1, 1])


def test_a_value_on_an_edge_falls_in_the_bin_above() -> None:
    assert bin_counts([0.2, 0.5], [0.1, 0.2, 0.3, 0.5, 0.9]) == [1, 2, 2]


def test_quantile_edges_split_into_tenths_and_merge_repeats() -> None:
    values = [i / 100 for i in range(100)]
    edges = quantile_edges(values)
    assert len(edges) == 9
    assert bin_counts(edges, values) == [10] * 10
    assert quantile_edges([0.3] * 50 + [0.7] * 50) == [0.7]


def test_the_reference_block_bins_finite_values_and_keeps_the_rate() -> None:
    rng = np.random.default_rng(0)
    scores = rng.random(1000)
    block = strong_share_reference(scores, 0.8)
    reference = DriftReference.model_validate(block)  # what the proxy reads
    assert reference.num_samples == 1000
    assert reference.rate == pytest.approx(float((scores >= 0.8).mean()), abs=1e-6)
    assert all(abs(share - 0.1) < 0.01 for share in reference.shares)
    confidence = np.concatenate([rng.normal(-1, 0.3, 300), [-np.inf] * 100])  # 100 answers without logprobs
    rung = DriftReference.model_validate(escalation_reference(confidence, -1.0))
    assert rung.num_samples == 300  # no bin for an answer without confidence …
    assert rung.rate == pytest.approx(float((confidence < -1.0).mean()), abs=1e-6)  # … but it escalated
    with pytest.raises(ValueError, match="finite"):
        reference_block(np.array([-np.inf]), 1.0)


def test_a_reference_block_with_the_wrong_number_of_shares_is_refused() -> None:
    with pytest.raises(ValueError, match="one more"):
        DriftReference(edges=[0.5], shares=[1.0], num_samples=3)


def _reference(values: list[float], rate: float) -> DriftReference:
    return DriftReference.model_validate(reference_block(np.array(values), rate))


def _reading(monitor: DriftMonitor, signal: str):
    return next(r for r in monitor.readings() if r.signal == signal)


def test_the_monitor_sees_a_shifted_mix_and_not_the_same_one() -> None:
    rng = random.Random(1)
    like = [rng.betavariate(2, 5) for _ in range(2000)]  # mostly easy prompts
    reference = _reference(like, sum(v >= 0.5 for v in like) / len(like))
    monitor = DriftMonitor(
        window=500, min_samples=100, psi_alert=0.2, classifier_reference=reference, classifier_threshold=0.5
    )
    for value in like[:99]:
        monitor.observe_score(value)
    assert _reading(monitor, CLASSIFIER_SCORE).psi is None  # under min_samples
    for value in like[99:500]:
        monitor.observe_score(value)
    same = _reading(monitor, CLASSIFIER_SCORE)
    assert same.psi is not None and same.psi < 0.05
    assert same.reference_source == "file" and same.num_samples == 500
    assert same.predicted_rate == reference.rate
    for _ in range(500):  # the window fills with hard prompts
        monitor.observe_score(rng.betavariate(5, 2))
    shifted = _reading(monitor, CLASSIFIER_SCORE)
    assert shifted.psi is not None and shifted.psi > 1.0
    assert shifted.observed_rate is not None and shifted.observed_rate > 0.7 > same.predicted_rate


def test_without_a_reference_the_first_window_after_load_is_the_reference() -> None:
    monitor = DriftMonitor(window=200, min_samples=50, psi_alert=0.2, rung_references={"small": None})
    rng = random.Random(2)
    for i in range(200):
        confidence = None if i % 10 == 0 else rng.gauss(-1, 0.3)
        monitor.observe_confidence("small", confidence, confidence is None or confidence < -1.2)
    monitor.observe_confidence("other", -5.0, True)  # not a judged rung: ignored
    warmed = _reading(monitor, CASCADE_CONFIDENCE)
    assert warmed.reference_source == "warm-up" and warmed.num_reference_samples == 180
    assert warmed.num_samples == 0 and warmed.psi is None  # the warm-up is not its own window
    assert warmed.predicted_rate is None  # nothing judged since: no answers to weigh predictions by
    for _ in range(100):
        monitor.observe_confidence("small", rng.gauss(-2, 0.3), True)
    drifted = _reading(monitor, CASCADE_CONFIDENCE)
    assert drifted.psi is not None and drifted.psi > 1.0
    assert drifted.observed_rate == 1.0
    assert drifted.predicted_rate is not None and 0.1 < drifted.predicted_rate < 0.4  # the warm-up's own rate


def test_the_cascade_psi_is_the_worst_rung_and_rates_pool_the_rungs() -> None:
    values = [i / 100 for i in range(100)]
    monitor = DriftMonitor(
        window=100,
        min_samples=10,
        psi_alert=0.2,
        rung_references={"a": _reference(values, 0.1), "b": _reference(values, 0.5)},
        has_classifier=False,
    )
    for v in values:
        monitor.observe_confidence("a", v, v < 0.1)
    for _ in range(100):
        monitor.observe_confidence("b", 0.05, True)
    reading = _reading(monitor, CASCADE_CONFIDENCE)
    assert [r.signal for r in monitor.readings()] == [CASCADE_CONFIDENCE]
    assert reading.psi == pytest.approx(psi(_reference(values, 0.5).shares, [100] + [0] * 9))
    assert reading.observed_rate == pytest.approx((10 + 100) / 200)
    assert reading.predicted_rate == pytest.approx((100 * 0.1 + 100 * 0.5) / 200)


def test_the_weak_sides_judged_win_rate_is_a_rate_over_the_window() -> None:
    monitor = DriftMonitor(window=4, min_samples=1, psi_alert=0.2, has_classifier=False)
    assert all(r.signal != "weak_win_rate" for r in monitor.readings())  # nothing graded yet
    for won in (True, False, False, True, True):  # the window keeps the last 4
        monitor.observe_label(won)
    [reading] = [r for r in monitor.readings() if r.signal == "weak_win_rate"]
    assert (reading.observed_rate, reading.num_samples, reading.psi, reading.predicted_rate) == (0.5, 4, None, None)
