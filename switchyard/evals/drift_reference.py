"""The `reference` block of a thresholds file: what a version expects of live traffic, for the
proxy's drift gauges and the report's Drift section (the block's schema and the PSI:
`switchyard.core.thresholds`, `switchyard.core.drift`).

`switchyard eval thresholds` and `classifier train` write it under `routing` from the classifier's
scores, `switchyard eval cascade` under each rung it fits from the rung's confidences; `eval
retune` writes both the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from switchyard.core.drift import quantile_edges, reference_of

NUM_BINS = 10


def reference_block(values: np.ndarray, rate: float, *, num_bins: int = NUM_BINS) -> dict[str, Any]:
    """The block for `values` (scores, or confidences; -inf or NaN: an answer with nothing to
    judge, which counts toward `rate` but has no bin) and the `rate` the thresholds predict on them
    (the strong-call share for routing, the escalation rate for a rung). Bins at the deciles of
    the finite values, so each holds about a tenth of them."""
    finite = [float(v) for v in np.asarray(values, dtype=float) if np.isfinite(v)]
    if not finite:
        raise ValueError("a drift reference needs at least one finite value")
    edges = [round(edge, 6) for edge in quantile_edges(finite, num_bins)]
    edges = sorted(set(edges))
    reference = reference_of(finite, round(float(rate), 6), edges)
    block = reference.model_dump()
    block["shares"] = [round(share, 6) for share in block["shares"]]
    return block


def strong_share_reference(scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """Routing's block: the classifier's scores, and the share at or above `threshold`."""
    scores = np.asarray(scores, dtype=float)
    return reference_block(scores, float((scores >= threshold).mean()))


def escalation_reference(confidence: np.ndarray, threshold: float) -> dict[str, Any]:
    """A cascade rung's block: its confidences (-inf: no logprobs, escalated), and the share below `threshold`."""
    confidence = np.asarray(confidence, dtype=float)
    return reference_block(confidence, float((confidence < threshold).mean()))
