from __future__ import annotations

import numpy as np
import pytest

from switchyard.cascade.confidence import FeatureScorer
from switchyard.core.traces import ModelOutcome, Trace
from switchyard.evals.cascade import CascadeData, cascade_curve, operating_point, pick_threshold, tune
from switchyard.evals.evaluate import EvalError


def _trace(i: int, weak_ok: bool, logprobs: list[float] | None, strong_ok: bool = True, split: str = "train") -> Trace:
    return Trace(
        f"q{i}",
        f"prompt {i}",
        "all",
        split,
        {
            "weak": ModelOutcome(float(weak_ok), 0.001, len(logprobs or [1]), token_logprobs=logprobs),
            "strong": ModelOutcome(float(strong_ok), 0.01, 10),
        },
    )


def test_a_threshold_rounded_to_be_written_keeps_the_ties_on_its_side():
    """Right answers sharing one confidence with many decimals: the threshold that keeps them,
    rounded as the thresholds file writes it, still keeps every one (it once sat on their value and
    rounded up past it, escalating them all in the proxy)."""
    from switchyard.evals.cascade import _finite

    traces = [_trace(i, True, [-0.123456781234]) for i in range(6)] + [_trace(9, False, [-3.0])]
    data = CascadeData.of(traces, "weak", "strong")
    confidence = data.confidence(FeatureScorer("mean_logprob"))
    curve = cascade_curve(confidence, data)
    index = pick_threshold(curve, data, quality_fraction=1.0)
    written = float(_finite(float(curve.thresholds[index])))
    assert operating_point(data, confidence, written)["escalation_rate"] == pytest.approx(1 / 7)


def test_the_curve_by_hand():
    traces = [
        _trace(0, True, [-0.1]),
        _trace(1, False, [-2.0]),
        _trace(2, False, [-1.0], strong_ok=False),
        _trace(3, True, [-0.5]),
    ]
    data = CascadeData.of(traces, "weak", "strong")
    confidence = data.confidence(FeatureScorer("mean_logprob"))
    curve = cascade_curve(confidence, data)
    assert curve.escalation_rate.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert curve.quality.tolist() == pytest.approx([0.5, 0.75, 0.75, 0.75, 0.75])
    assert curve.cost_usd.tolist() == pytest.approx([0.001, 0.0035, 0.006, 0.0085, 0.011])
    # escalate confidence < -1.5 (halfway to the next value): only the -2.0 answer; -2.5: none
    assert curve.thresholds.tolist()[:2] == [-2.5, -1.5]
    point = operating_point(data, confidence, curve.thresholds[1])
    assert (point["quality"], point["escalation_rate"]) == (0.75, 0.25)
    assert point["auroc"] == 1.0
    index = pick_threshold(curve, data, quality_fraction=1.0)
    assert index == 1  # the cheapest point at full quality
    assert pick_threshold(curve, data, max_cost_usd=0.002) == 0


def test_answers_without_logprobs_are_always_escalated():
    traces = [_trace(0, True, None), _trace(1, True, [-0.1]), _trace(2, False, [-3.0])]
    data = CascadeData.of(traces, "weak", "strong")
    curve = cascade_curve(data.confidence(FeatureScorer("mean_logprob")), data)
    assert curve.escalation_rate[0] == pytest.approx(1 / 3)


def _noisy(n: int, seed: int, split: str) -> list[Trace]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok = bool(rng.random() < 0.6)
        centre = -0.2 if ok else -1.2
        out.append(_trace(i, ok, list(rng.normal(centre, 0.6, int(rng.integers(1, 30)))), split=split))
    return out


def test_tuning_beats_chance_and_meets_the_target_on_train():
    train = CascadeData.of(_noisy(400, 1, "train"), "weak", "strong")
    test = CascadeData.of(_noisy(200, 2, "test"), "weak", "strong")
    report = tune(train, test, "weak", "strong", quality_fraction=0.9)
    assert report.test["auroc"] > 0.75
    assert report.train["quality"] >= 0.9 * report.train["quality_strong"] - 1e-9
    assert 0 < report.test["escalation_rate"] < 1
    assert report.test["cost_usd"] < report.test["cost_weak_usd"] + report.test["cost_strong_usd"]
    learned = tune(train, test, "weak", "strong", scorer_name="learned", quality_fraction=0.9)
    assert learned.scorer.name == "learned" and learned.test["auroc"] > 0.75


def test_no_logprobs_at_all_is_a_clear_error():
    traces = [_trace(i, i % 2 == 0, None) for i in range(10)]
    data = CascadeData.of(traces, "weak", "strong")
    with pytest.raises(EvalError, match="token_logprobs"):
        tune(data, data, "weak", "strong", quality_fraction=0.9)
