"""Similarity of a query vector to a store's rows, the one way every store computes it."""

from __future__ import annotations

import numpy as np


def cosines(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Each row's cosine with `query` (both unit vectors: their dot product). einsum, not `@`: BLAS
    wakes its threads for a product this size, and a lookup that followed a wait on Valkey paid
    2.6 ms at p50 for 1,000 rows on 2 busy cores, against 0.13 ms here."""
    return np.einsum("ij,j->i", vectors, query)
