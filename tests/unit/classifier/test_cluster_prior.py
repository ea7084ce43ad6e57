"""The cluster prior: out-of-fold cluster rates, with k-means results reused for the same rows."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from switchyard.classifier import cluster_prior
from switchyard.classifier.cluster_prior import ClusterPrior


def _rows(seed: int, n: int = 120) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_reused_clusters_are_the_ones_kmeans_finds():
    rows = _rows(1)
    centres, labels = cluster_prior._kmeans(rows, 8, 0)
    direct = KMeans(n_clusters=8, n_init=1, max_iter=100, random_state=0).fit(rows)
    assert np.array_equal(labels, direct.labels_)
    assert np.allclose(centres, direct.cluster_centers_)
    again = cluster_prior._kmeans(rows.copy(), 8, 0)  # equal rows, another array: the same result object
    assert again[0] is centres and again[1] is labels
    other = cluster_prior._kmeans(_rows(2), 8, 0)
    assert other[0] is not centres
    assert cluster_prior._kmeans(rows, 8, 1)[0] is not centres  # another seed is another clustering


def test_labels_change_the_rates_but_not_the_clusters():
    rows = _rows(3)
    y = (rows[:, 0] > 0).astype(int)
    first = ClusterPrior(num_clusters=8, embedding_dim=16).fit_transform(rows, y)
    flipped = ClusterPrior(num_clusters=8, embedding_dim=16).fit_transform(rows, 1 - y)
    assert first.shape == (len(rows), 18)
    assert np.allclose(first[:, :16], rows)
    assert not np.allclose(first[:, 16:], flipped[:, 16:])  # each label vector gets its own rates
    assert np.allclose(first, ClusterPrior(num_clusters=8, embedding_dim=16).fit_transform(rows, y))
