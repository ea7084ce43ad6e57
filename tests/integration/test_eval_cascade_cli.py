"""`switchyard eval cascade` on trace files it did not write, and the proxy loading what it wrote."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cascade.confidence import LogisticScorer
from switchyard.cli import app
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread

runner = CliRunner()


def _mmlu_like(path, n=500, seed=0):
    """Multiple-choice answers: one token each (the letter), its logprob only; no split, no header."""
    rng = np.random.default_rng(seed)
    with path.open("wb") as handle:
        for i in range(n):
            p = float(rng.uniform(0.25, 1.0))
            right = bool(rng.random() < p)  # the surer the letter, the likelier it is right
            weak = {"quality": float(right), "cost_usd": 0.00001, "output_tokens": 1, "token_logprobs": [math.log(p)]}
            strong = {"quality": float(rng.random() < 0.9), "cost_usd": 0.0003, "output_tokens": 1}
            row = {
                "id": f"mmlu/{i}",
                "prompt": f"Question {i}?\nA. x\nB. y\nAnswer:",
                "models": {"tiny": weak, "big": strong},
            }
            handle.write(orjson.dumps(row) + b"\n")


def _eval_cascade(tmp_path, *options: str):
    """`eval cascade` on a fresh multiple-choice-like trace file, weak `tiny`, strong `big`."""
    traces, out = tmp_path / "mc.jsonl", tmp_path / "thresholds.yaml"
    _mmlu_like(traces)
    command = ["eval", "cascade", "--traces", str(traces), "--weak", "tiny", "--strong", "big"]
    result = runner.invoke(
        app, [*command, "--out", str(out), "--report", str(tmp_path), *options], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result, out


def test_eval_cascade_json_on_single_token_traces(tmp_path):
    result, out = _eval_cascade(tmp_path, "--json")
    report = orjson.loads(result.stdout)  # one JSON object, nothing else
    assert isinstance(report["threshold"], float)
    test = report["test"]
    assert set(test) >= {"quality", "cost_usd", "escalation_rate", "auroc"}
    assert test["auroc"] > 0.6 and 0 < test["escalation_rate"] < 1
    assert "split 80/20" in " ".join(report["notes"])
    section = yaml.safe_load(out.read_text())["cascade"]["rungs"]["tiny"]
    assert section["strong_model"] == "big" and section["threshold"] == report["threshold"]
    # the drift reference: every prompt's confidence binned, and the escalation rate over both splits
    reference, data = section["reference"], section["data"]
    assert reference["num_samples"] == data["num_train"] + data["num_test"]  # every single-token answer judged
    assert len(reference["shares"]) == len(reference["edges"]) + 1 and sum(reference["shares"]) == pytest.approx(1)
    train, test = section["train"]["escalation_rate"], section["test"]["escalation_rate"]
    expected = (data["num_train"] * train + data["num_test"] * test) / reference["num_samples"]
    assert reference["rate"] == pytest.approx(expected, abs=1e-5)
    assert (tmp_path / "cascade-mc.png").read_bytes().startswith(b"\x89PNG")
    assert "<svg" in (tmp_path / "cascade-mc.html").read_text()


def test_the_proxy_loads_the_scorer_eval_cascade_wrote(tmp_path):
    result, out = _eval_cascade(tmp_path, "--scorer", "learned", "--max-cost", "0.0002")
    assert "cascade.rungs.tiny" in result.output and "AUROC" in result.output
    cost = yaml.safe_load(out.read_text())["cascade"]["rungs"]["tiny"]["train"]["cost_usd"]
    assert cost <= 0.0002
    settings = Settings(
        models=[
            {"name": "tiny", "base_url": "http://127.0.0.1:9/v1"},
            {"name": "big", "base_url": "http://127.0.0.1:9/v1"},
        ],
        routing={"thresholds_file": out},
        cascade={"ladder": ["tiny", "big"]},
    )
    application = create_app(settings)
    with serve_in_thread(application):
        rung = application.state.services.cascade.rungs[0]
    assert isinstance(rung.scorer, LogisticScorer)
    assert rung.threshold == yaml.safe_load(out.read_text())["cascade"]["rungs"]["tiny"]["threshold"]


def test_eval_cascade_names_the_problem_with_traces_without_logprobs(tmp_path):
    traces = tmp_path / "plain.jsonl"
    rows = [
        {
            "id": str(i),
            "prompt": "p",
            "split": "train" if i % 2 else "test",
            "models": {
                "a": {"quality": i % 2, "cost_usd": 0.1, "output_tokens": 1},
                "b": {"quality": 1, "cost_usd": 1.0, "output_tokens": 1},
            },
        }
        for i in range(20)
    ]
    traces.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    result = runner.invoke(app, ["eval", "cascade", "--traces", str(traces), "--out", str(tmp_path / "t.yaml")])
    assert result.exit_code != 0
    assert "token_logprobs" in result.output


SHIPPED = str(Path(__file__).resolve().parents[2] / "evals/data/arithmetic/traces-smollm2-gemma.jsonl.gz")


def test_real_traces_confidence_predicts_a_right_answer(tmp_path):
    """SmolLM2's own logprobs on the shipped arithmetic traces (collected with `eval collect`)."""
    result = runner.invoke(
        app,
        [
            "eval",
            "cascade",
            "--traces",
            SHIPPED,
            "--scorer",
            "learned",
            "--best-quality",
            "--json",
            "--out",
            str(tmp_path / "t.yaml"),
            "--report",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert (report["weak_model"], report["strong_model"]) == ("local-small", "local-large")
    assert report["test"]["auroc"] > 0.75
    assert report["auroc_by_scorer"]["test"]["mean_entropy"] > 0.7
    assert report["test"]["quality"] >= report["test"]["quality_weak"]
    result = runner.invoke(
        app,
        [
            "eval",
            "cascade",
            "--traces",
            SHIPPED,
            "--json",
            "--out",
            str(tmp_path / "t.yaml"),
            "--report",
            str(tmp_path),
        ],
    )
    assert "no better than local-small" in " ".join(orjson.loads(result.stdout)["notes"])


def test_the_shipped_thresholds_file_judges_local_small():
    from switchyard.backends.defaults import DEFAULT_THRESHOLDS
    from switchyard.cascade.build import rung_specs
    from switchyard.core.settings import CascadeSettings
    from switchyard.core.thresholds import read_thresholds

    specs = rung_specs(CascadeSettings(ladder=["local-small", "local-large"]), read_thresholds(DEFAULT_THRESHOLDS))
    assert specs[0].source == "thresholds file" and specs[0].scorer.name == "first_mean_entropy"
    assert specs[1].source == "config"
