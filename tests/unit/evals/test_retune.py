"""`switchyard eval retune`: a shifted mix the shipped head cannot see is learnt from the rows and
recovers the target quality at lower cost on the newest rows; rows with nothing to learn change
nothing and write nothing; bad input is named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from switchyard.backends.defaults import DEFAULT_THRESHOLDS
from switchyard.cascade.confidence import FeatureScorer
from switchyard.classifier.model import DEFAULT_ARTIFACT, ComplexityClassifier, design_matrix_of
from switchyard.cli import app
from switchyard.core.settings import parse_settings
from switchyard.core.thresholds import read_thresholds
from switchyard.core.traces import write_traces
from switchyard.evals import metrics
from switchyard.evals.evaluate import EvalError, Outcomes
from switchyard.evals.retune import CurrentCascade, CurrentRouting, retune
from switchyard.evals.retune_rows import embedded_rows, paired_rows, parse_since, split_by_time
from switchyard.gateway.services import check_startup
from tests.unit.evals.retune_world import START, STRONG, WEAK, labelled_rows

SHIPPED = read_thresholds(DEFAULT_THRESHOLDS).routing
assert SHIPPED is not None
CURRENT_ROUTING = CurrentRouting(
    DEFAULT_ARTIFACT,
    {"balanced": SHIPPED.values()[0], **{mode: s.values()[0] for mode, s in SHIPPED.modes.items()}},
    {"balanced": {"quality_fraction": 0.95}, "economy": {"quality_fraction": 0.9}, "max": {"quality_fraction": 0.99}},
)
CURRENT_CASCADE = CurrentCascade(FeatureScorer("first_mean_logprob", 16), -0.8, 16)  # the config's defaults


def _retune(rows):
    timed = split_by_time(paired_rows(rows, WEAK, STRONG, None), 0.3)
    result = retune(timed, WEAK, STRONG, routing=CURRENT_ROUTING, cascade=CURRENT_CASCADE, target_quality=0.95, seed=0)
    return timed, result


@pytest.fixture(scope="module")
def shifted():
    return _retune(labelled_rows(600, learnable=True))


@pytest.fixture(scope="module")
def unlearnable():
    return _retune(labelled_rows(600, learnable=False))


def test_a_shifted_mix_is_learnt_and_costs_less_at_the_target_on_the_newest_rows(shifted):
    timed, result = shifted
    routing = result.routing
    assert routing is not None and routing.classifier is not None  # the residual won on the newest fit rows
    assert routing.fit.inner_log_loss["shipped"] > min(routing.fit.inner_log_loss.values())
    assert routing.num_held_out == len(timed.held_out) == 180
    # the shipped head cannot tell the two kinds apart; the re-tuned one can
    assert routing.before["apgr"] < 0.5 < 0.7 < routing.after["apgr"]
    assert routing.comparison.is_better
    assert routing.comparison.after < 0.7 * routing.comparison.before
    # at the new balanced threshold, the newest rows get most of the strong model's quality for far fewer strong calls
    assert routing.after["strong_share"] < 0.6 < 0.9 < routing.before["strong_share"]
    assert routing.after["pgr"] > 0.75
    cascade = result.cascade
    assert cascade is not None and cascade.comparison.is_better
    assert cascade.before["auroc"] == 0.5 and cascade.report.test["auroc"] > 0.95
    assert cascade.report.test["quality"] >= 0.95 * cascade.report.test["quality_strong"]


def test_the_retuned_head_starts_from_the_shipped_one(shifted):
    timed, result = shifted
    shipped = ComplexityClassifier.load(DEFAULT_ARTIFACT)
    has, embeddings, features = embedded_rows(timed.rows)
    x = design_matrix_of(embeddings, features, shipped.subject_prior)
    head = result.routing.classifier.head
    head_at_start = type(head)(head.base, 1.0, 0.0, head.mean_, head.scale_, np.zeros_like(head.coef_))
    assert np.allclose(head_at_start.score(x), shipped.score_design(x), atol=1e-5)


def test_rows_with_nothing_to_learn_are_not_better_beyond_noise(unlearnable):
    _, result = unlearnable
    assert result.routing is not None
    low, high = result.routing.comparison.ci95
    assert low <= 0 < high  # a head fitted to noise may look cheaper on these rows, not beyond noise
    assert not result.routing.comparison.is_better
    assert result.cascade is not None and not result.cascade.comparison.is_better


def _config(tmp_path, ledger: bool = False) -> str:
    models = [
        {"name": WEAK, "backend": "vllm", "base_url": "http://127.0.0.1:9/v1", "tier": "small"},
        {"name": STRONG, "backend": "vllm", "base_url": "http://127.0.0.1:9/v1", "tier": "large"},
    ]
    config = {
        "models": models,
        "routing": {"thresholds_file": str(DEFAULT_THRESHOLDS), "auto": {"tiers": ["small", "large"]}},
        "cascade": {"ladder": [WEAK, STRONG]},
        "billing": {"ledger_path": None},
    }
    path = tmp_path / "switchyard.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_eval_retune_writes_what_the_proxy_reads_only_when_better(tmp_path):
    config, traces, out = _config(tmp_path), tmp_path / "rows.jsonl", tmp_path / "retuned.yaml"
    rows = labelled_rows(600, learnable=True)
    write_traces(traces, rows)
    plot = tmp_path / "retune.png"
    args = ["eval", "retune", "--config", config, "--traces", str(traces), "--out", str(out), "--plot", str(plot)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "routing (420 rows fit, 180 held out" in result.output
    assert f"routing.auto.classifier_artifact: {tmp_path / 'retuned-classifier'}" in result.output
    assert plot.stat().st_size > 0
    written = read_thresholds(out)
    assert written.routing is not None and written.routing.router == "classifier"
    assert set(written.routing.modes) == {"economy", "max"}
    assert written.cascade is not None and written.cascade.rungs[WEAK].scorer["kind"] == "logistic"
    provenance = written.model_dump()["provenance"]
    # drift references of what the new version expects: the newest rows under the new settings
    routing_reference = written.model_dump()["routing"]["reference"]
    assert routing_reference["rate"] == pytest.approx(provenance["routing"]["after"]["strong_share"], abs=1e-6)
    assert routing_reference["num_samples"] == 180
    assert written.model_dump()["cascade"]["rungs"][WEAK]["reference"]["num_samples"] == 180
    assert provenance["rows"] == {"total": 600, "fit": 420, "held_out": 180}
    assert provenance["routing"]["written"] and provenance["routing"]["comparison"]["ci95"][0] > 0
    # the proxy starts on both, and the artifact on disk routes the newest rows as the run reported
    settings = yaml.safe_load(Path(config).read_text())
    settings["routing"]["thresholds_file"] = str(out)
    settings["routing"]["auto"]["classifier_artifact"] = str(tmp_path / "retuned-classifier")
    startup = check_startup(parse_settings(settings, "retuned config"))
    assert startup.auto_thresholds is not None
    assert startup.auto_thresholds["balanced"] == [written.routing.threshold]
    assert [spec.source for spec in startup.cascade_specs] == ["thresholds file", "config"]
    classifier = ComplexityClassifier.load(tmp_path / "retuned-classifier")
    held = rows[420:]
    _, embeddings, features = embedded_rows(held)
    scores = classifier.score_design(design_matrix_of(embeddings, features, classifier.subject_prior))
    outcomes = Outcomes.of(held, WEAK, STRONG)
    decisions = scores >= written.routing.threshold
    assert decisions.mean() == pytest.approx(provenance["routing"]["after"]["strong_share"], abs=1e-6)
    apgr = metrics.apgr(outcomes.curve(scores), outcomes.quality_weak, outcomes.quality_strong)
    assert apgr == pytest.approx(provenance["routing"]["after"]["apgr"], abs=1e-6)

    # nothing learnable: nothing written, exit 1
    write_traces(traces, labelled_rows(600, learnable=False))
    out.unlink()
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "not better beyond noise" in result.output
    assert f"{out} not written" in result.output
    assert not out.exists()


def _without(key: str, rows):
    for row in rows:
        row.extra[key] = None
    return rows


def _no_logprobs(rows):
    for row in rows:
        row.models[WEAK].token_logprobs = None
    return rows


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        (labelled_rows(40, learnable=True), ["--since", "last week"], "--since 'last week' is neither a duration"),
        (
            labelled_rows(25, learnable=True),
            ["--since", "2020-01-01", "--holdout", "0.3"],
            "25 rows grade both models: too few to fit on 70% and report on 30% (each part needs 10)",
        ),
        (
            labelled_rows(40, learnable=True),
            ["--since", "3000-01-01"],
            "none of the 40 labelled rows grades both 'cheap' and 'dear' in the window",
        ),
        (
            _no_logprobs(_without("embedding", labelled_rows(60, learnable=True))),
            [],
            "nothing to re-tune: routing: 0 of 60 rows carry the classifier's embedding and features",
        ),
        (_without("created_at", labelled_rows(60, learnable=True)), [], "row 'r0' has no created_at"),
    ],
)
def test_bad_input_is_named(tmp_path, rows, options, message):
    traces = tmp_path / "rows.jsonl"
    write_traces(traces, rows)
    args = ["eval", "retune", "--config", _config(tmp_path), "--traces", str(traces), "--out", str(tmp_path / "o.yaml")]
    result = CliRunner().invoke(app, [*args, *options], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "o.yaml").exists()


def test_a_malformed_embedding_names_its_row():
    rows = labelled_rows(3, learnable=True)
    rows[1].extra["embedding"] = [0.1, 0.2]
    with pytest.raises(EvalError, match="row 'r1': embedding must be 384 numbers, not 2"):
        embedded_rows(rows)


def test_an_empty_trace_file_is_named(tmp_path):
    traces = tmp_path / "rows.jsonl"
    traces.write_text("")
    args = ["eval", "retune", "--config", _config(tmp_path), "--traces", str(traces), "--out", str(tmp_path / "o.yaml")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "no traces" in result.output


@pytest.mark.parametrize(
    ("value", "seconds_before_now"),
    [("7d", 7 * 86400), ("36h", 36 * 3600), ("90m", 5400), ("2w", 14 * 86400), ("45s", 45)],
)
def test_since_takes_a_duration(value, seconds_before_now):
    assert parse_since(value, now=START) == START - seconds_before_now


def test_since_takes_a_utc_date():
    assert parse_since("2026-11-01") == parse_since("2026-11-01T00:00:00+00:00") == 1_793_491_200.0


def test_eval_retune_reads_the_learning_rows_from_the_configs_ledger(tmp_path, monkeypatch):
    """The rows the shadow sampler stores (learning/rows.py), read through `--config`: the same split
    and a written file, as from a trace file."""
    import asyncio

    from switchyard.billing.store.base import open_database
    from switchyard.learning.rows import LearningRow, insert_row

    ledger = tmp_path / "usage.db"
    monkeypatch.delenv("SWITCHYARD__BILLING__LEDGER_PATH", raising=False)  # the suite's own ledger: the config's here
    config = yaml.safe_load(Path(_config(tmp_path)).read_text())
    config["billing"] = {"ledger_path": str(ledger), "redis_url": "none"}
    path = tmp_path / "ledger.yaml"
    path.write_text(yaml.safe_dump(config))

    async def store(rows) -> None:
        database = await open_database(f"sqlite:///{ledger}")
        try:
            for row in rows:
                await insert_row(
                    database,
                    LearningRow(
                        request_id=row.id,
                        created_at=row.extra["created_at"],
                        team="search",
                        route=row.category,
                        prompt_key=f"key-{row.id}",
                        models={name: outcome.to_dict() for name, outcome in row.models.items()},
                        embedding=np.asarray(row.extra["embedding"], dtype=np.float32),
                        features=row.extra["features"],
                        label_source="judge",
                    ),
                )
        finally:
            await database.aclose()

    asyncio.run(store(labelled_rows(600, learnable=True)))
    out = tmp_path / "retuned.yaml"
    args = ["eval", "retune", "--config", str(path), "--since", "2020-01-01", "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "routing (420 rows fit, 180 held out" in result.output
    assert read_thresholds(out).model_dump()["provenance"]["rows"] == {"total": 600, "fit": 420, "held_out": 180}
