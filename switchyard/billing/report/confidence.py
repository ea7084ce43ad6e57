"""The cascade's judged answers: each model's confidence scores against the threshold it had to reach.

A judged attempt's record keeps its confidence (None: the answer carried no logprobs) and its
threshold. Scores are counted at three significant digits, so memory holds a few thousand distinct
values per model however many answers were judged; whether a score was below its threshold is
counted exactly, from the score itself. The histogram's bins span the model's scores and its
thresholds, so every threshold line falls on the plot.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from switchyard.billing.records import UsageRecord

NUM_BINS = 24


@dataclass(slots=True)
class Judged:
    """The answers of one model judged against one threshold."""

    num_judged: int = 0
    num_below: int = 0  # scored under the threshold: escalated, unless nothing was left to climb on
    num_without: int = 0  # no logprobs, no score
    lowest: float | None = None
    highest: float | None = None

    def add(self, confidence: float | None, threshold: float) -> None:
        self.num_judged += 1
        if confidence is None:
            self.num_without += 1
            return
        self.num_below += confidence < threshold
        self.lowest = confidence if self.lowest is None else min(self.lowest, confidence)
        self.highest = confidence if self.highest is None else max(self.highest, confidence)


class ConfidenceSums:
    def __init__(self) -> None:
        self.scores: dict[str, Counter[float]] = defaultdict(Counter)  # model -> score (3 digits) -> answers
        self.judged: dict[tuple[str, float], Judged] = defaultdict(Judged)  # (model, threshold)

    def add(self, record: UsageRecord) -> None:
        """A record the cascade judged (its threshold is set)."""
        assert record.threshold is not None
        self.judged[(record.model, record.threshold)].add(record.confidence, record.threshold)
        if record.confidence is not None:
            self.scores[record.model][float(f"{record.confidence:.3g}")] += 1

    def histogram(self, model: str) -> list[tuple[float, float, int]]:
        """(low, high, answers) per bin; the last bin holds its upper edge."""
        scores = self.scores.get(model)
        if not scores:
            return []
        thresholds = [threshold for (name, threshold) in self.judged if name == model]
        low, high = min(*scores, *thresholds), max(*scores, *thresholds)
        if low == high:
            low, high = low - 0.5, high + 0.5
        counts, edges = np.histogram(
            list(scores), bins=NUM_BINS, range=(low, high), weights=np.array(list(scores.values()), dtype=float)
        )
        return [(float(edges[i]), float(edges[i + 1]), int(round(counts[i]))) for i in range(NUM_BINS)]
