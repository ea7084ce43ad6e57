"""Routing among N tiers by value, offline: the matrix rule is the proxy's, tolerances are picked
where the artifact did not learn, and `switchyard eval tiers` writes what the proxy reads."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from switchyard.classifier.by_value import pick_by_value
from switchyard.cli import app
from switchyard.core.thresholds import read_thresholds
from switchyard.core.traces import Trace, write_traces
from switchyard.evals import tiers
from switchyard.evals.datasets import load_dataset

LADDER = ["llama-3.1-8b-instruct", "llama-3.3-nemotron-super-49b-v1", "llama-3.1-nemotron-51b-instruct"]


def test_the_matrix_rule_is_the_proxys_rule():
    rng = np.random.default_rng(7)
    predicted = rng.random((400, 4)).round(2)  # rounded: ties happen, and must break the same way
    costs = rng.choice([1.0, 2.0, 5.0], size=(400, 4))
    for tolerance in (0.0, 0.03, 0.1, 0.5):
        expected = [pick_by_value(list(q), list(c), tolerance).chosen for q, c in zip(predicted, costs, strict=True)]
        assert tiers.route_by_value(predicted, costs, tolerance).tolist() == expected


def _data(quality, cost) -> tiers.TierData:
    traces = [Trace(str(i), f"p{i}", "unit", "train", {}) for i in range(len(quality))]
    return tiers.TierData(traces, np.array(quality, dtype=float), np.array(cost, dtype=float))


def test_the_tolerance_picked_is_the_cheapest_that_reaches_the_target():
    # tier 1 is right on every prompt, tier 0 on half; the prediction knows which half
    quality = [[1, 1], [0, 1], [1, 1], [0, 1]]
    cost = [[1, 10]] * 4
    predicted = np.array([[0.875, 1.0], [0.25, 1.0], [0.75, 1.0], [0.5, 1.0]])  # gaps 1/8, 3/4, 1/4, 1/2
    data = _data(quality, cost)
    # the right two may go cheap, the wrong two may not: any tolerance below 1/2 (the grid's last: 0.4975)
    assert tiers.pick_tolerance(data, predicted, data.cost, 1.0) == pytest.approx(0.4975)
    # 75% of the best tier's quality: one wrong prompt may go cheap too (below 3/4)
    assert tiers.pick_tolerance(data, predicted, data.cost, 0.75) == pytest.approx(0.7475)
    point = tiers.operating_point(data, tiers.route_by_value(predicted, data.cost, 0.25), ["a", "b"])
    assert point == {"quality": 1.0, "cost_usd_per_1k": 5500.0, "share": {"a": 0.5, "b": 0.5}}
    assert tiers.random_at(data, 5500.0) == pytest.approx(0.75)  # half the way from tier 0 to tier 1
    # a target nothing reaches: no tolerance
    hopeless = np.array([[0.9, 0.1]] * 4)
    assert tiers.pick_tolerance(_data([[0, 1]] * 4, cost), hopeless, np.array(cost, dtype=float), 1.01) == 0.0


def test_each_mode_is_tuned_on_one_split_and_reported_on_the_other():
    quality, cost = [[1, 1], [0, 1], [1, 1], [0, 1]], [[1, 10]] * 4
    tuning, test = _data(quality, cost), _data(quality, cost)
    tuning_predicted = np.array([[0.875, 1.0], [0.25, 1.0], [0.75, 1.0], [0.5, 1.0]])
    test_predicted = np.array([[0.9, 1.0]] * 4)  # on the test split every gap is small: all go cheap
    modes = tiers.tune_modes(tuning, tuning_predicted, test, test_predicted, ["a", "b"])
    assert list(modes) == ["economy", "balanced", "max"]
    # four prompts: 90%, 95% and 99% of the best tier's quality all need every prompt right
    assert [mode["tolerance"] for mode in modes.values()] == [pytest.approx(0.4975)] * 3
    assert modes["economy"]["target"] == {"quality_fraction": 0.90}
    assert modes["balanced"]["tuning"] == {"quality": 1.0, "cost_usd_per_1k": 5500.0, "share": {"a": 0.5, "b": 0.5}}
    assert modes["balanced"]["test"] == {"quality": 0.5, "cost_usd_per_1k": 1000.0, "share": {"a": 1.0, "b": 0.0}}


def test_an_artifact_that_saw_the_train_split_is_tuned_on_held_out_prompts():
    traces = [Trace(str(i), f"prompt {i}", "unit", "train" if i < 50 else "test", {}) for i in range(100)]
    tuning, test, where = tiers.tuning_and_test(traces, artifact_saw_train=False)
    assert [t.split for t in tuning] == ["train"] * 50 and [t.split for t in test] == ["test"] * 50
    tuning, test, where = tiers.tuning_and_test(traces, artifact_saw_train=True)
    assert {t.split for t in tuning} == {t.split for t in test} == {"test"}
    assert not {t.id for t in tuning} & {t.id for t in test} and len(tuning) + len(test) == 50
    assert "half the test split" in where


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """60 train and 30 test prompts of LLMRouter, as a trace file (the artifact never saw it by name)."""
    traces, _ = load_dataset("llmrouter")
    chosen = [t for t in traces if t.split == "train"][:60] + [t for t in traces if t.split == "test"][:30]
    path = tmp_path_factory.mktemp("tiers") / "ladder.jsonl"
    write_traces(path, chosen)
    return path


def test_eval_tiers_writes_what_the_proxy_reads(tmp_path, trace_file):
    out, thresholds = tmp_path / "out", tmp_path / "thresholds.yaml"
    specs = [f"--tier={name}={model}" for name, model in zip(("small", "large", "xl"), LADDER, strict=True)]
    result = CliRunner().invoke(
        app,
        ["eval", "tiers", "-d", str(trace_file), *specs, "--out", str(out), "--thresholds-out", str(thresholds)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "picked on the train split, reported on the test split" in result.output
    assert "by value, balanced" in result.output and "random, same cost" in result.output
    assert (out / "tiers-ladder.png").stat().st_size > 10_000
    section = read_thresholds(thresholds).routing
    assert section is not None and section.by_value is not None
    assert section.by_value.quality_models == dict(zip(("small", "large", "xl"), LADDER, strict=True))
    tolerances = section.by_value.tolerances()
    assert tolerances["economy"] >= tolerances["balanced"] >= tolerances["max"]
    extra = section.by_value.model_extra or {}
    assert extra["data"]["num_tuning"] == 60 and extra["data"]["num_test"] == 30


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["--tier=small=llama-3.1-8b-instruct"], "at least two --tier"),
        (["--tier=small", "--tier=xl=llama-3.1-8b-instruct"], "NAME=MODEL, not 'small'"),
        (["--tier=a=llama-3.1-8b-instruct", "--tier=b=gpt-5"], "predicts no quality for 'gpt-5'"),
        (["--tier=a=llama-3.1-8b-instruct", "--tier=b=gpt-4-turbo"], "no prompts graded for gpt-4-turbo"),
    ],
)
def test_eval_tiers_names_what_is_wrong(trace_file, specs, message):
    result = CliRunner().invoke(app, ["eval", "tiers", "-d", str(trace_file), *specs], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
