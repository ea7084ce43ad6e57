"""The candidate heads on synthetic rows: each finds a planted signal; sources keep their own pairs."""

from __future__ import annotations

import numpy as np
import pytest

from switchyard.classifier.heads import HEADS, MFHead, build_training_rows
from switchyard.core.traces import ModelOutcome, Trace
from switchyard.evals.metrics import auroc

DIM = 8


def _source(name: str, weak: str, strong: str, n: int, rng: np.random.Generator) -> tuple[list[Trace], dict]:
    """Prompts whose first coordinate says whether the strong model is needed."""
    traces, vectors = [], {}
    for i in range(n):
        vector = rng.normal(size=DIM)
        vector /= np.linalg.norm(vector)
        hard = vector[0] > 0
        prompt = f"{name}/{i}"
        vectors[prompt] = vector
        models = {
            weak: ModelOutcome(float(not hard or rng.random() < 0.1), 0.0, 1),
            strong: ModelOutcome(float(rng.random() < 0.95), 0.0, 1),
        }
        traces.append(Trace(prompt, prompt, name, "train", models))
    return traces, vectors


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    a, va = _source("a", "small-a", "large-a", 600, rng)
    b, vb = _source("b", "small-b", "large-b", 200, rng)
    vectors = {**va, **vb}
    pairs = {"a": ("small-a", "large-a"), "b": ("small-b", "large-b")}

    def design(prompts):
        return np.array([vectors[p] for p in prompts])

    return {"a": a, "b": b}, pairs, design


def test_rows_label_each_source_with_its_own_pair_and_balance_sources(data):
    traces, pairs, design = data
    rows = build_training_rows(traces, pairs, design)
    assert rows.models == ["large-a", "large-b", "small-a", "small-b"]
    assert rows.x.shape == (800, DIM) and len(rows.triples) == 1600
    assert np.isclose(rows.weight.mean(), 1.0)
    assert rows.weight[rows.source == 1][0] > rows.weight[rows.source == 0][0]  # the smaller source weighs more a row
    assert {tuple(p) for p in rows.pair[rows.source == 1]} == {(3, 1)}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_each_head_finds_the_planted_signal(data, name):
    traces, pairs, design = data
    fit_traces = {k: v[: int(len(v) * 0.75)] for k, v in traces.items()}
    held = [t for v in traces.values() for t in v[int(len(v) * 0.75) :]]
    kwargs = {"knn": {"embedding_dim": DIM}, "gbm": {"max_iter": 40}, "mf": {"epochs": 15}, "length": {"column": 0}}
    kwargs = kwargs.get(name, {})
    head = HEADS[name](seed=0, **kwargs).fit(build_training_rows(fit_traces, pairs, design))
    scores = head.score(design([t.prompt for t in held]))
    assert np.all((scores >= 0) & (scores <= 1))
    needs_strong = design([t.prompt for t in held])[:, 0] > 0
    assert auroc(scores, needs_strong) > 0.8


def test_mf_predicts_each_models_quality(data):
    traces, pairs, design = data
    head = MFHead(seed=0, epochs=20).fit(build_training_rows(traces, pairs, design))
    easy, hard = np.eye(DIM)[[0]] * -1, np.eye(DIM)[[0]]
    small_a, large_a = head.models_.index("small-a"), head.models_.index("large-a")
    assert head.quality(easy, [small_a])[0, 0] > 0.7 > head.quality(hard, [small_a])[0, 0]
    assert head.quality(hard, [large_a])[0, 0] > 0.7
    assert head.score(hard, (small_a, large_a))[0] > head.score(easy, (small_a, large_a))[0]


def test_a_heads_artifact_is_version_2_and_round_trips(data, tmp_path):
    import json

    import sklearn

    from switchyard.classifier.embedder import STATIC_MINILM
    from switchyard.classifier.heads import make_head
    from switchyard.classifier.model import ArtifactError, ComplexityClassifier

    traces, pairs, _ = data
    rng = np.random.default_rng(1)
    vectors = {t.prompt: rng.normal(size=384) for v in traces.values() for t in v}

    def design(prompts):
        from switchyard.classifier.model import design_matrix

        return design_matrix(np.array([vectors[p] for p in prompts], dtype=np.float32), prompts)

    head = make_head("mf+length", seed=0)
    assert head.name == "mf+length"
    head.fit(build_training_rows(traces, pairs, design))
    metadata = {"embedding_model": STATIC_MINILM, "libraries": {"scikit-learn": sklearn.__version__}}
    ComplexityClassifier(head=head, metadata=metadata).save(tmp_path)
    assert json.loads((tmp_path / "metadata.json").read_text())["version"] == 2
    loaded = ComplexityClassifier.load(tmp_path)
    prompts = ["a/1", "b/2", "a/3"]
    embeddings = np.array([vectors[p] for p in prompts], dtype=np.float32)
    assert np.allclose(loaded.score_embedded(embeddings, prompts), head.score(design(prompts)))
    (tmp_path / "metadata.json").write_text(json.dumps({**metadata, "version": 3}))
    with pytest.raises(ArtifactError, match="reads versions 1, 2"):
        ComplexityClassifier.load(tmp_path)


def test_unknown_head_names_are_refused():
    from switchyard.classifier.heads import make_head

    with pytest.raises(ValueError, match="unknown head 'svm'"):
        make_head("mf+svm")


def test_an_undefined_metric_is_saved_as_null(tmp_path):
    """Too few held-out prompts make a validation APGR undefined (NaN): metadata.json stays JSON."""
    import json

    from switchyard.classifier.heads import make_head
    from switchyard.classifier.model import ComplexityClassifier

    metadata = {"validation_apgr": {"mf": float("nan")}, "per_dataset": [1.0, float("inf")], "head": "length"}
    ComplexityClassifier(make_head("length"), metadata).save(tmp_path)
    saved = json.loads((tmp_path / "metadata.json").read_text())
    assert saved["validation_apgr"] == {"mf": None} and saved["per_dataset"] == [1.0, None]
