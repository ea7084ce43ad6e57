"""`switchyard eval route` and `switchyard eval thresholds` on the shipped data and on trace files."""

from __future__ import annotations

import re

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.core.settings import Settings
from switchyard.core.thresholds import ThresholdsError
from switchyard.gateway.services import check_startup
from switchyard.proxy.app import create_app

runner = CliRunner()


def _apgr(output: str, router: str) -> float:
    match = re.search(rf"│ {re.escape(router)}\s*│\s*([0-9.]+)", output)
    assert match, output
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["gsm8k", "mmlu"])
def test_eval_route_on_the_shipped_data(tmp_path, dataset):
    result = runner.invoke(app, ["eval", "route", "--dataset", dataset, "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for router in ("random", "length", "category-prior"):
        assert 0.0 < _apgr(result.output, router) < 1.0
    assert _apgr(result.output, "random") == pytest.approx(0.5, abs=0.08)
    assert _apgr(result.output, "oracle (reference)") > _apgr(result.output, "category-prior")
    png = (tmp_path / f"route-{dataset}.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    page = (tmp_path / f"route-{dataset}.html").read_text()
    assert "<svg" in page and "category-prior" in page and "<script" not in page


def _write_traces(path, n=400):
    lines = []
    for i in range(n):
        hard = i % 4 == 0
        lines.append(
            orjson.dumps(
                {
                    "id": f"q{i}",
                    "prompt": ("long hard question " * 20 if hard else "easy?") + str(i),
                    "category": "hard" if hard else "easy",
                    "split": "test" if i % 5 == 0 else "train",
                    "models": {
                        "small": {
                            "quality": 0.0 if hard else 1.0,
                            "cost_usd": 0.001,
                            "output_tokens": 1,
                            "token_logprobs": [-0.1],
                        },
                        "big": {"quality": 1.0, "cost_usd": 0.01, "output_tokens": 1},
                    },
                }
            )
        )
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_eval_route_on_a_trace_file_picks_weak_and_strong_by_cost(tmp_path):
    traces = tmp_path / "traces.jsonl"
    _write_traces(traces)
    result = runner.invoke(
        app,
        ["eval", "route", "--dataset", str(traces), "--router", "length", "--router", "random", "--out", str(tmp_path)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "small → big" in result.output
    # Length separates the 25% hard prompts perfectly: PGR climbs to 1 over the first 25% of strong
    # calls, then stays: 0.25 * 0.5 + 0.75 * 1 = 0.875.
    assert _apgr(result.output, "length") == pytest.approx(0.875, abs=0.002)
    assert (tmp_path / "route-traces.png").exists() and (tmp_path / "route-traces.html").exists()
    table_only = tmp_path / "table-only"
    result = runner.invoke(
        app,
        ["eval", "route", "-d", str(traces), "-r", "length", "--no-plot", "--out", str(table_only)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert _apgr(result.output, "length") == pytest.approx(0.875, abs=0.002) and not table_only.exists()


def test_eval_route_names_unknown_routers(tmp_path):
    result = runner.invoke(app, ["eval", "route", "--dataset", "gsm8k", "--router", "psychic"])
    assert result.exit_code == 2
    assert "unknown router 'psychic'" in result.output


def test_eval_thresholds_writes_a_file_the_proxy_reads(tmp_path):
    traces, out = tmp_path / "traces.jsonl", tmp_path / "thresholds.yaml"
    _write_traces(traces)
    result = runner.invoke(
        app,
        [
            "eval",
            "thresholds",
            "--dataset",
            str(traces),
            "--router",
            "category-prior",
            "--target-quality",
            "0.95",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    routing = data["routing"]
    assert data["version"] == 1
    assert routing["router"] == "category-prior"
    assert routing["weak_model"] == "small" and routing["strong_model"] == "big"
    assert routing["target"] == {"quality_fraction": 0.95}
    assert routing["test"]["quality"] >= 0.95 and routing["test"]["strong_share"] < 0.5
    assert len(routing["data"]["sha256"]) == 64
    loaded = check_startup(Settings(routing={"thresholds_file": out})).thresholds  # what the proxy reads at start
    assert loaded.routing.router == "category-prior"
    assert loaded.routing.values() == [routing["threshold"]]
    # the drift reference: both splits' scores in bins, and the strong share the threshold predicts on them
    reference, num = loaded.routing.reference, routing["data"]
    assert reference is not None and reference.num_samples == num["num_train"] + num["num_test"]
    assert sum(reference.shares) == pytest.approx(1.0, abs=1e-5)
    expected = num["num_train"] * routing["train"]["strong_share"] + num["num_test"] * routing["test"]["strong_share"]
    assert reference.rate == pytest.approx(expected / reference.num_samples, abs=1e-5)
    out.write_text(out.read_text().replace("version: 1", "version: 7"))
    with pytest.raises(ThresholdsError, match="version 7"):
        create_app(Settings(routing={"thresholds_file": out}))


def test_eval_thresholds_needs_exactly_one_target(tmp_path):
    result = runner.invoke(app, ["eval", "thresholds", "--dataset", "gsm8k", "--router", "length"])
    assert result.exit_code == 2
    assert "exactly one of --target-quality or --max-strong-share" in result.output


def test_eval_route_compares_artifacts_on_prompts_none_was_fitted_on(tmp_path):
    from switchyard.classifier.model import ARTIFACTS, DEFAULT_ARTIFACT

    other = next(name for name in ("static-logreg", "static-mf-length") if name != DEFAULT_ARTIFACT.name)
    traces = tmp_path / "traces.jsonl"
    _write_traces(traces, n=60)
    result = runner.invoke(
        app,
        [
            "eval",
            "route",
            "-d",
            str(traces),
            "--artifacts",
            str(ARTIFACTS / "static-logreg"),
            "--artifacts",
            str(ARTIFACTS / "static-mf-length"),
            "--out",
            str(tmp_path / "out"),
        ],
        env={"COLUMNS": "220"},
    )
    assert result.exit_code == 0, result.output
    # no shipped artifact saw this file: every prompt is held out, not only its test split
    assert "traces.jsonl: 60 prompts (all prompts), small → big" in result.output
    rows = {
        name: re.search(rf"│ {name}\s*│\s*([0-9.]+)\s*│\s*([0-9.]+) … ([0-9.]+)\s*│([^│]*)│", result.output)
        for name in ("static-logreg", "static-mf-length")
    }
    assert all(rows.values()), result.output
    for match in rows.values():
        assert float(match.group(2)) <= float(match.group(1)) <= float(match.group(3))
    assert rows[DEFAULT_ARTIFACT.name].group(4).strip() == ""  # the others are measured against the default
    assert re.match(r"\s*[+-][0-9.]+", rows[other].group(4))
    assert "best on chat" not in result.output  # a trace file is not one of the chat sets
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--artifacts", "all", "--router", "length"], "--router and --artifacts do not go together"),
        ([], "give --dataset (or --artifacts"),
        (["-d", "gsm8k", "-d", "mmlu"], "one --dataset at a time"),
        (["--artifacts", "no-such-folder", "-d", "gsm8k"], "no readable classifier artifact in no-such-folder"),
    ],
)
def test_eval_route_says_what_is_wrong_with_its_options(args, message):
    result = runner.invoke(app, ["eval", "route", *args])
    assert result.exit_code == 2
    assert message in result.output
