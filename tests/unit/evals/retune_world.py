"""Synthetic labelled rows in the labelled-rows layout (evals/TRACE_FORMAT.md) for the re-tune tests:
a two-kind mix told apart by one direction in embedding space that the shipped head never saw.

Embeddings sit near the shipped head's own cluster centres (means of real prompts' embeddings), so
its scores spread as they do on real traffic; the kind is independent of the cluster."""

from __future__ import annotations

from functools import cache

import numpy as np

from switchyard.classifier.embedder import EMBEDDING_DIM
from switchyard.classifier.features import FEATURE_NAMES, prompt_features
from switchyard.classifier.model import DEFAULT_ARTIFACT, ComplexityClassifier
from switchyard.core.traces import ModelOutcome, Trace

WEAK, STRONG = "cheap", "dear"
START = 1_790_000_000.0
FEATURES = dict(zip(FEATURE_NAMES, prompt_features("Work out the answer and explain it."), strict=True))


@cache
def _shipped_centres() -> np.ndarray:
    fast_head = ComplexityClassifier.load(DEFAULT_ARTIFACT).fast_head
    assert fast_head is not None
    return fast_head.folds[0].centres


def labelled_rows(n: int, *, learnable: bool, seed: int = 0) -> list[Trace]:
    """`learnable`: the weak model fails exactly the prompts on one side of a hidden direction, and
    its answers there carry one unsure token past the first 16 (which `first_mean_logprob` cannot
    see); else it is right or wrong, and unsure, at random."""
    rng = np.random.default_rng(seed)
    centres = _shipped_centres()
    direction = np.random.default_rng(1234).normal(size=EMBEDDING_DIM)
    direction /= np.linalg.norm(direction)
    rows = []
    for i in range(n):
        hard = bool(rng.random() < 0.5)
        centre = centres[rng.integers(len(centres))]
        embedding = centre + 0.01 * rng.normal(size=EMBEDDING_DIM) + (0.3 if hard else -0.3) * direction
        embedding /= np.linalg.norm(embedding)
        weak_right = (not hard) if learnable else bool(rng.random() < 0.5)
        strong_right = bool(rng.random() < 0.95) if learnable else bool(rng.random() < 0.8)
        unsure = (not weak_right) if learnable else bool(rng.random() < 0.5)
        logprobs = [-0.1] * 16 + [-0.2, -4.0 if unsure else -0.2, -0.2, -0.1]
        rows.append(
            Trace(
                id=f"r{i}",
                prompt="",
                category="auto",
                split="train",
                models={
                    WEAK: ModelOutcome(float(weak_right), 0.0001, 100, token_logprobs=logprobs),
                    STRONG: ModelOutcome(float(strong_right), 0.001, 100),
                },
                extra={
                    "created_at": START + 60 * i,
                    "team": None,
                    "prompt_key": f"{i:064x}",
                    "embedding": [round(float(x), 6) for x in embedding],
                    "features": FEATURES,
                    "score": None,
                    "routing_version": None,
                    "label_source": "verifiable",
                },
            )
        )
    return rows
