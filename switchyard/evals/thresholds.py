"""Picking routing thresholds on the train split (the file itself: `switchyard.core.thresholds`)."""

from __future__ import annotations

import numpy as np

from switchyard.evals import metrics
from switchyard.evals.evaluate import EvalError, Outcomes


def pick_threshold(
    train: Outcomes,
    scores: np.ndarray,
    *,
    quality_fraction: float | None = None,
    max_strong_share: float | None = None,
) -> float:
    """The train-split threshold that meets the target with the fewest strong calls.

    `quality_fraction`: reach that fraction of the strong model's quality. `max_strong_share`:
    the most quality while sending at most that share of prompts to the strong model.
    """
    if (quality_fraction is None) == (max_strong_share is None):
        raise EvalError("give exactly one target: a quality fraction or a maximum strong share")
    curve = train.curve(scores)
    if quality_fraction is not None:
        reached = np.flatnonzero(curve.quality >= quality_fraction * train.quality_strong)
        index = int(reached[0]) if len(reached) else len(curve.quality) - 1
    else:
        assert max_strong_share is not None  # exactly one target: checked above
        allowed = np.flatnonzero(curve.strong_share <= max_strong_share + 1e-12)
        index = int(allowed[np.argmax(curve.quality[allowed])])
    threshold = float(curve.thresholds[index])
    return threshold if np.isfinite(threshold) else float(np.nextafter(scores.max(), np.inf))


def operating_point(outcomes: Outcomes, scores: np.ndarray, threshold: float) -> dict[str, float]:
    decisions = (scores >= threshold).astype(float)
    quality = metrics.decision_quality(decisions, outcomes.q_weak, outcomes.q_strong)
    return {
        "strong_share": round(float(decisions.mean()), 6),
        "quality": round(quality, 6),
        "pgr": round(float(metrics.pgr(quality, outcomes.quality_weak, outcomes.quality_strong)), 6),
        "cost_usd_per_1k": round(1000 * metrics.decision_cost(decisions, outcomes.c_weak, outcomes.c_strong), 6),
    }
