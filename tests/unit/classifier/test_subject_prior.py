from __future__ import annotations

import numpy as np

from switchyard.classifier.subject_prior import SubjectPrior, subject_rates


def _data(n: int, seed: int):
    """Three subjects, each a blob in embedding space, with positive rates 0.1, 0.5 and 0.9."""
    rng = np.random.default_rng(seed)
    subjects = rng.integers(0, 3, n)
    centres = np.eye(8)[:3] * 3
    embeddings = centres[subjects] + rng.normal(0, 1, (n, 8))
    y = (rng.random(n) < np.array([0.1, 0.5, 0.9])[subjects]).astype(float)
    return embeddings, subjects, y


def test_rates_are_smoothed_towards_the_overall_rate():
    rates = subject_rates(np.array([0, 0, 1]), np.array([1.0, 1.0, 0.0]), 3, smoothing=1.0)
    overall = 2 / 3
    assert np.allclose(rates, [(2 + overall) / 3, overall / 2, overall])


def test_unseen_prompts_get_the_prior_of_the_subject_they_look_like():
    embeddings, subjects, y = _data(600, 0)
    prior = SubjectPrior(["a", "b", "c"]).fit_classifier(embeddings, subjects).fit_rates(subjects, y)
    test_embeddings, test_subjects, _ = _data(300, 1)
    predicted = prior.predict(test_embeddings)
    means = [predicted[test_subjects == k].mean() for k in range(3)]
    assert means[0] < 0.3 < means[1] < 0.7 < means[2]


def test_out_of_fold_features_never_see_their_own_label():
    embeddings, subjects, y = _data(200, 2)
    oof = SubjectPrior(["a", "b", "c"]).out_of_fold(embeddings, subjects)
    before = oof.prior(y)
    flipped = y.copy()
    flipped[7] = 1 - flipped[7]
    after = oof.prior(flipped)
    assert after[7] == before[7]  # its own label moved nothing for it …
    assert not np.allclose(np.delete(after, 7), np.delete(before, 7))  # … but did for rows in other folds
