"""The complexity classifier on real embeddings: training on a small seeded sample, the artifact,
and offline scoring."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from switchyard.classifier.embedder import Embedder
from switchyard.classifier.model import DEFAULT_ARTIFACT, MINILM_ARTIFACT, ArtifactError, ComplexityClassifier
from switchyard.cli import app
from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.classifier_train import train
from switchyard.evals.datasets import STRONG_MODEL, WEAK_MODEL, load_mmlu
from switchyard.evals.evaluate import Outcomes
from switchyard.evals.routers import RandomRouter, make_router

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedder():
    return Embedder(num_threads=2)


@pytest.fixture(scope="module")
def small_run(embedder, tmp_path_factory):
    traces = random.Random(7).sample(load_mmlu(), 1600)
    texts = sorted({t.prompt for t in traces})
    matrix = embedder.encode(texts)
    row = {text: i for i, text in enumerate(texts)}

    def encode(batch):
        return matrix[[row[t] for t in batch]]

    result = train({"mmlu": traces}, WEAK_MODEL, STRONG_MODEL, encode, seed=0)
    return traces, encode, result


def test_a_classifier_trained_on_a_small_sample_beats_random_on_held_out_prompts(small_run):
    traces, encode, result = small_run
    test = Outcomes.of([t for t in traces if t.split == "test"], WEAK_MODEL, STRONG_MODEL)
    prompts = [t.prompt for t in test.traces]
    scores = result.classifier.score_embedded(encode(prompts), prompts)
    assert np.all((scores >= 0) & (scores <= 1))
    apgr = metrics.apgr(test.curve(scores), test.quality_weak, test.quality_strong)
    random_apgr = metrics.apgr(
        test.curve(RandomRouter(seed=0).score(test.traces)), test.quality_weak, test.quality_strong
    )
    assert apgr > random_apgr + 0.05, (apgr, random_apgr)
    assert result.classifier.metadata["target"] in ("weak-wrong", "strong-wins")


def test_the_artifact_round_trips(small_run, embedder, tmp_path):
    _, _, result = small_run
    result.classifier.save(tmp_path)
    loaded = ComplexityClassifier.load(tmp_path, embedder=embedder)
    texts = ["What is 2 + 2?", "Prove that every bounded monotone sequence of reals converges."]
    assert np.allclose(loaded.score(texts), result.classifier.score(texts))
    assert loaded.metadata["libraries"]["scikit-learn"]
    metadata = orjson.loads((tmp_path / "metadata.json").read_bytes())
    metadata["version"] = 99
    (tmp_path / "metadata.json").write_bytes(orjson.dumps(metadata))
    with pytest.raises(ArtifactError, match="version 99"):
        ComplexityClassifier.load(tmp_path)


def test_the_shipped_artifact_loads_with_its_metrics(embedder):
    classifier = ComplexityClassifier.load(MINILM_ARTIFACT, embedder=embedder)
    assert classifier.metadata["data"]["datasets"] == ["gsm8k", "mmlu"]
    assert set(classifier.metadata["test"]) == {"gsm8k", "mmlu"}
    scores = classifier.score(["hi", "A train leaves at 3pm at 60 mph; another at 4pm at 80 mph. When do they meet?"])
    assert np.all((scores >= 0) & (scores <= 1))


def test_the_eval_router_named_classifier_scores_prompts_with_the_default_artifact():
    prompts = ["hi", "Prove that every bounded monotone sequence of reals converges."]
    router = make_router("classifier")
    scores = router.score([Trace(str(i), p, "unit", "test", {}) for i, p in enumerate(prompts)])
    assert router.name == "classifier"
    assert np.allclose(scores, ComplexityClassifier.load(DEFAULT_ARTIFACT).score(prompts))


def test_classifier_score_cli(tmp_path):
    source, out = tmp_path / "prompts.jsonl", tmp_path / "scores.jsonl"
    source.write_bytes(
        b"\n".join(
            orjson.dumps({"id": i, "prompt": p})
            for i, p in enumerate(["hi", "Explain the proof of Fermat's last theorem in detail."])
        )
        + b"\n"
    )
    result = CliRunner().invoke(app, ["classifier", "score", "--in", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["id"] for r in rows] == [0, 1]
    assert all(0 <= r["score"] <= 1 for r in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    result = CliRunner().invoke(app, ["classifier", "score", "--in", str(bad), "--out", str(out)])
    assert result.exit_code == 2 and 'needs "id" and a string "prompt"' in result.output
