from __future__ import annotations

import numpy as np
import pytest

from switchyard.classifier.fast_head import compile_head
from switchyard.classifier.model import (
    MULTI_SOURCE_ARTIFACT,
    STATIC_ARTIFACT,
    ComplexityClassifier,
    design_matrix,
)
from switchyard.evals.classifier_train import fit_head


def _design(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    embeddings = rng.normal(size=(n, 384))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    texts = [f"question {i}? " + "why " * int(rng.integers(0, 40)) for i in range(n)]
    return design_matrix(embeddings.astype(np.float32), texts)


def test_the_numpy_head_gives_scikit_learns_numbers():
    x = _design(300, 0)
    y = (x[:, 0] + 0.3 * np.random.default_rng(1).normal(size=300) > 0).astype(int)
    head = fit_head(x, y, c=0.3, seed=0)
    fast = compile_head(head)
    held = _design(50, 2)
    assert fast is not None
    assert np.allclose(fast.predict_positive(held), head.predict_proba(held)[:, 1], atol=1e-12)
    huge = held.copy()
    huge[:, 384:] *= 1e6  # features far outside the training range: no overflow warnings (errors here)
    assert np.all(np.isfinite(fast.predict_positive(huge)))


def test_the_shipped_logreg_artifact_uses_it():
    classifier = ComplexityClassifier.load(STATIC_ARTIFACT)
    assert classifier.fast_head is not None


def test_the_mf_length_artifact_scores_in_numpy_without_scikit_learn():
    from switchyard.classifier.heads import Head

    classifier = ComplexityClassifier.load(MULTI_SOURCE_ARTIFACT)
    assert classifier.fast_head is None and isinstance(classifier.head, Head)


def test_other_heads_keep_scikit_learns_path():
    from sklearn.linear_model import LogisticRegression

    assert compile_head(LogisticRegression().fit(np.eye(2), [0, 1])) is None


@pytest.mark.parametrize("n", [1, 7])
def test_batch_sizes(n):
    x = _design(120, 3)
    head = fit_head(x, (np.arange(120) % 3 == 0).astype(int), c=0.05, seed=0)
    assert np.allclose(compile_head(head).predict_positive(x[:n]), head.predict_proba(x[:n])[:, 1], atol=1e-12)
