"""Classifier artifacts side by side: only prompts none of them was fitted on, chat sets first,
paired bootstrap intervals, and the best on chat named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from switchyard.classifier.model import ARTIFACTS, DEFAULT_ARTIFACT
from switchyard.core.traces import ModelOutcome, Trace
from switchyard.evals import artifact_compare, metrics
from switchyard.evals.artifact_compare import ArtifactResult, SetResult
from switchyard.evals.datasets import CHAT_SETS, load_dataset
from switchyard.evals.evaluate import Outcomes


def _traces(n: int, seed: int = 3) -> list[Trace]:
    rng = np.random.default_rng(seed)
    gains = rng.random(n)  # how much better the strong model is on each prompt
    return [
        Trace(
            f"t{i}",
            f"prompt {i}",
            "unit",
            "test" if i % 4 == 0 else "train",
            {"weak": ModelOutcome(0.2, 0.001, 1), "strong": ModelOutcome(0.2 + 0.8 * float(g), 0.01, 1)},
        )
        for i, g in enumerate(gains)
    ]


def test_a_set_an_artifact_trained_on_keeps_only_its_test_split():
    traces = _traces(40)
    metadatas = [{"data": {"datasets": ["gsm8k", "mmlu"]}}, {"data": {"datasets": ["arena"]}}]
    kept, which = artifact_compare.held_out(traces, ("mmlu",), metadatas)
    assert which == "test split" and {t.split for t in kept} == {"test"} and len(kept) == 10
    kept, which = artifact_compare.held_out(traces, ("vicuna80",), metadatas)
    assert which == "all prompts" and kept == traces
    # a trace file is known by the name `classifier train` was given or by its file name
    kept, which = artifact_compare.held_out(
        traces, ("data/ours.jsonl", "ours.jsonl"), [{"data": {"datasets": ["ours.jsonl"]}}]
    )
    assert which == "test split"


def test_a_file_without_a_test_split_is_split_as_training_split_it():
    traces = [Trace(t.id, t.prompt, t.category, "train", t.models) for t in _traces(40)]
    kept, which = artifact_compare.held_out(traces, ("ours.jsonl",), [{"data": {"datasets": ["ours.jsonl"]}}])
    assert which == "test split" and 0 < len(kept) < 40


def test_compare_resamples_the_same_prompts_for_every_artifact():
    traces = _traces(200)
    outcomes = Outcomes.of(traces, "weak", "strong")
    gain = outcomes.q_strong - outcomes.q_weak
    scores = {
        "knows": gain,
        "noisy": gain + np.random.default_rng(0).normal(0, 0.3, len(gain)),
        "random": np.random.default_rng(1).random(len(gain)),
    }
    results = {r.artifact: r for r in artifact_compare.compare(outcomes, scores, reference="random")}
    for r in results.values():
        curve = outcomes.curve(scores[r.artifact])
        assert r.apgr == pytest.approx(metrics.apgr(curve, outcomes.quality_weak, outcomes.quality_strong))
        low, high = r.apgr_interval
        assert low <= r.apgr <= high
    assert results["knows"].apgr > results["noisy"].apgr > results["random"].apgr
    assert results["random"].delta == 0.0 and results["random"].delta_interval == (0.0, 0.0)
    # 200 prompts: the perfect ranking's lead over random is far outside the noise
    assert results["knows"].delta_interval[0] > 0
    # paired: the difference's interval is narrower than the two APGR intervals side by side
    noisy, knows = results["noisy"], results["knows"]
    width = knows.delta_interval[1] - knows.delta_interval[0]
    assert width < (knows.apgr_interval[1] - knows.apgr_interval[0]) + (noisy.apgr_interval[1] - noisy.apgr_interval[0])
    again = {r.artifact: r for r in artifact_compare.compare(outcomes, scores, reference="random")}
    assert again["noisy"].apgr_interval == noisy.apgr_interval  # the same seed draws the same resamples


def test_strong_calls_at_the_quality_target_are_read_off_the_curve():
    # the strong model is better on 2 of 4 prompts (by 1 each): 95% of strong quality (0.75) is
    # 0.7125, reached between routing one and both of them when the scorer finds them first
    q_weak, q_strong = np.array([0.0, 0.0, 0.5, 0.5]), np.array([1.0, 1.0, 0.5, 0.5])
    cost = np.zeros(4)
    curve = metrics.routing_curve(np.array([0.9, 0.8, 0.1, 0.2]), q_weak, q_strong, cost, cost)
    assert metrics.strong_share_at_quality(curve, 0.95 * 0.75) == pytest.approx(0.25 + 0.25 * (0.7125 - 0.5) / 0.25)
    backwards = metrics.routing_curve(np.array([0.1, 0.2, 0.9, 0.8]), q_weak, q_strong, cost, cost)
    assert metrics.strong_share_at_quality(backwards, 0.95 * 0.75) > 0.75


def _set(name: str, apgrs: dict[str, float]) -> SetResult:
    nan2 = (float("nan"), float("nan"))
    rows = [ArtifactResult(a, v, nan2, 0.0, nan2, 0.0, 0.0, 0.0) for a, v in apgrs.items()]
    return SetResult(name, name in CHAT_SETS, "w", "s", 10, "all prompts", rows)


def test_the_best_on_chat_is_chosen_on_chat_sets_only():
    results = [
        _set("arena", {"a": 0.50, "b": 0.56}),
        _set("vicuna80", {"a": 0.60, "b": 0.58}),
        _set("mmlu", {"a": 0.90, "b": 0.10}),
    ]
    assert artifact_compare.best_on_chat(results) == ("b", pytest.approx(0.57))
    assert artifact_compare.best_on_chat(results[2:]) is None


def test_chat_sets_come_first_and_every_shipped_artifact_is_found(tmp_path):
    assert artifact_compare.chat_first(["mmlu", "arena", "gsm8k", "vicuna80"]) == ["arena", "vicuna80", "mmlu", "gsm8k"]
    assert artifact_compare.DEFAULT_SETS[: len(CHAT_SETS)] == CHAT_SETS
    shipped = artifact_compare.shipped_artifacts(ARTIFACTS, DEFAULT_ARTIFACT)
    assert shipped[0] == DEFAULT_ARTIFACT
    assert sorted(p.name for p in shipped) == ["minilm-logreg", "static-logreg", "static-mf-length"]
    for name in ("b", "a", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metadata.json").write_text(json.dumps({}))
    (tmp_path / "not-an-artifact").mkdir()
    assert [p.name for p in artifact_compare.shipped_artifacts(tmp_path, tmp_path / "c")] == ["c", "a", "b"]


def test_vicuna80_is_graded_chat_with_its_pair():
    traces, meta = load_dataset("vicuna80")
    assert len(traces) == 76 and {t.split for t in traces} == {"train", "test"}
    weak, strong = meta["weak_model"], meta["strong_model"]
    assert all(weak in t.models and strong in t.models for t in traces)
    first = traces[0]  # "How can I improve my time management skills?": graded 9.0 and 9.0
    assert first.models[weak].quality == pytest.approx(0.9) and first.models[strong].quality == pytest.approx(0.9)
    assert "Apache-2.0" in meta["source"] and first.models[strong].cost_usd > first.models[weak].cost_usd > 0
