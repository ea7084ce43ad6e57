from __future__ import annotations

import numpy as np
import pytest

from switchyard.core.thresholds import THRESHOLDS_VERSION, ThresholdsError, read_thresholds, write_section
from switchyard.core.traces import ModelOutcome, Trace
from switchyard.evals.evaluate import EvalError, Outcomes, evaluate_routers, resolve_models
from switchyard.evals.routers import CategoryPrior, make_router
from switchyard.evals.thresholds import operating_point, pick_threshold


def _trace(i: int, category: str, weak_q: float, strong_q: float, split: str = "train") -> Trace:
    models = {
        "w": ModelOutcome(quality=weak_q, cost_usd=1.0, output_tokens=1),
        "s": ModelOutcome(quality=strong_q, cost_usd=10.0, output_tokens=1),
    }
    return Trace(f"t{i}", "x" * (i + 1), category, split, models)


HAND = [_trace(0, "a", 1, 1), _trace(1, "a", 0, 1), _trace(2, "b", 0, 1), _trace(3, "b", 1, 0)]
SCORES = np.array([0.1, 0.9, 0.8, 0.2])


def test_category_prior_learns_strong_win_rates_from_train():
    train = [_trace(0, "hard", 0, 1), _trace(1, "hard", 0, 1), _trace(2, "easy", 1, 1), _trace(3, "easy", 0, 1)]
    router = CategoryPrior()
    router.fit(train, "w", "s")
    assert router.rates == {"hard": 1.0, "easy": 0.5}
    assert router.score([_trace(9, "easy", 0, 0), _trace(9, "unseen", 0, 0)]).tolist() == [0.5, 0.75]


def test_oracle_beats_every_baseline_and_random_is_near_half():
    rng = np.random.default_rng(3)
    traces = [
        _trace(i, f"c{i % 5}", float(rng.random() < 0.6), float(rng.random() < 0.8), "test" if i % 5 == 0 else "train")
        for i in range(5000)
    ]
    routers = [make_router(name) for name in ("random", "length", "category-prior", "oracle")]
    _, results = evaluate_routers(routers, traces, "w", "s")
    by_name = {r.name: r for r in results}
    assert by_name["random"].apgr == pytest.approx(0.5, abs=0.06)
    assert by_name["oracle"].apgr > max(r.apgr for r in results if r.name != "oracle")


def test_pick_threshold_for_a_quality_target_and_for_a_share_cap():
    outcomes = Outcomes.of(HAND, "w", "s")
    # Quality along the sweep: .5, .75, 1, .75, .75; 95% of strong (0.75) is first met at score 0.9.
    assert pick_threshold(outcomes, SCORES, quality_fraction=0.95) == 0.9
    assert pick_threshold(outcomes, SCORES, max_strong_share=0.5) == 0.8
    point = operating_point(outcomes, SCORES, 0.8)
    assert point == {"strong_share": 0.5, "quality": 1.0, "pgr": 2.0, "cost_usd_per_1k": 5500.0}
    with pytest.raises(EvalError):
        pick_threshold(outcomes, SCORES)


def test_a_target_met_without_strong_calls_routes_nothing_strong():
    outcomes = Outcomes.of(HAND, "w", "s")
    threshold = pick_threshold(outcomes, SCORES, quality_fraction=0.5)
    assert operating_point(outcomes, SCORES, threshold)["strong_share"] == 0.0


def test_resolve_models_by_cost_when_unnamed():
    assert resolve_models(HAND, {}, None, None) == ("w", "s")
    with pytest.raises(EvalError, match="--weak and --strong"):
        resolve_models(HAND + [Trace("x", "p", "a", "train", {"z": ModelOutcome(1, 1, 1)})], {}, None, None)


def test_thresholds_file_round_trip_keeps_other_sections(tmp_path):
    path = tmp_path / "thresholds.yaml"
    write_section(path, "cascade", {"threshold": -0.4})
    write_section(path, "routing", {"router": "category-prior", "threshold": 0.25})
    data = read_thresholds(path)
    assert data.version == THRESHOLDS_VERSION
    assert data.routing.threshold == 0.25 and data.routing.router == "category-prior"
    assert data.cascade.model_dump()["threshold"] == -0.4
    assert "created" in data.routing.model_dump()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 99\nrouting: {threshold: 0.2}\n", "understands version 1"),
        ("routing: {threshold: 0.2}\n", "no 'version'"),
        ("version: 1\nrouting: {threshold: high}\n", "must be a number"),
    ],
)
def test_unusable_thresholds_files_are_refused(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ThresholdsError, match=message):
        read_thresholds(path)
