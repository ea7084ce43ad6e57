"""Drift: how far live classifier scores and cascade confidences have moved from what the loaded
version expects (its thresholds file's `reference` blocks, `switchyard.core.thresholds`).

The measure is the population stability index over the reference's bins:

    PSI = sum over bins i of (o_i - r_i) * ln(o_i / r_i)

where r_i is the reference's share of values in bin i and o_i the live window's; a share under
`EPSILON` counts as `EPSILON`, so an empty bin gives a large but finite term. PSI is 0 for the same
mix; by the usual reading, under 0.1 is stable, 0.1-0.2 a moderate shift, over 0.2 a large one.

Per process, each signal keeps the last `window` values in a deque: the request's path appends
one value (O(1)); the bins and the PSI are computed when `/metrics` is read. A signal whose
thresholds file has no reference takes the first `window` values it sees after load as its
reference (its `source` is then `warm-up`), and only the values after them as its window.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from switchyard.core.thresholds import DriftReference, ThresholdsFile

EPSILON = 1e-4
WARM_UP_BINS = 10
CLASSIFIER_SCORE = "classifier_score"
CASCADE_CONFIDENCE = "cascade_confidence"
SIGNALS = (CLASSIFIER_SCORE, CASCADE_CONFIDENCE)
WEAK_WIN_RATE = "weak_win_rate"  # a rate only: the share of graded shadow pairs the weak side won or tied


def bin_of(edges: Sequence[float], value: float) -> int:
    """The bin of `value` among the len(edges) + 1 bins (bin i: edges[i-1] <= v < edges[i])."""
    return bisect_right(edges, value)


def bin_counts(edges: Sequence[float], values: Iterable[float]) -> list[int]:
    """How many of `values` fall in each bin (`bin_of`)."""
    counts = [0] * (len(edges) + 1)
    for value in values:
        counts[bisect_right(edges, value)] += 1
    return counts


def psi(reference_shares: Sequence[float], observed_counts: Sequence[int]) -> float:
    """The population stability index of `observed_counts` against `reference_shares` (same bins)."""
    total = sum(observed_counts)
    if total == 0 or len(reference_shares) != len(observed_counts):
        raise ValueError("psi needs observed values, binned as the reference is")
    index = 0.0
    for reference, count in zip(reference_shares, observed_counts, strict=True):
        r, o = max(reference, EPSILON), max(count / total, EPSILON)
        index += (o - r) * math.log(o / r)
    return index


def quantile_edges(values: Sequence[float], num_bins: int = WARM_UP_BINS) -> list[float]:
    """Inner edges that split `values` into `num_bins` bins of about equal counts (fewer when values repeat)."""
    ordered = sorted(values)
    if not ordered:
        return []
    picked = {ordered[min(len(ordered) - 1, (len(ordered) * i) // num_bins)] for i in range(1, num_bins)}
    return sorted(edge for edge in picked if edge > ordered[0])


def reference_of(values: Sequence[float], rate: float | None, edges: Sequence[float] | None = None) -> DriftReference:
    """A reference from `values` (bins at their deciles unless `edges` are given)."""
    edges = list(edges) if edges is not None else quantile_edges(values)
    counts = bin_counts(edges, values)
    return DriftReference(edges=edges, shares=[c / len(values) for c in counts], num_samples=len(values), rate=rate)


@dataclass(frozen=True, slots=True)
class Reading:
    """One signal now: PSI (None until the window holds `min_samples`), the observed rate (None
    while the window is empty or the rate is not measured) and the rate its reference predicts."""

    signal: str
    psi: float | None
    observed_rate: float | None
    predicted_rate: float | None
    num_samples: int  # values in the window
    reference_source: str | None  # file | warm-up; None: still warming up
    num_reference_samples: int


class SignalWindow:
    """The last `window` values of one stream (one signal, or one cascade rung) and whether each
    counted toward the rate (a strong call, an escalation)."""

    def __init__(self, reference: DriftReference | None, window: int) -> None:
        self.reference = reference
        self.source = "file" if reference is not None else None
        self.window = window
        self.values: deque[float] = deque(maxlen=window)  # None-free: an answer without confidence has no bin
        self.hits: deque[bool] = deque(maxlen=window)
        self._warm_values: list[float] = []
        self._warm_hits: list[bool] = []

    def observe(self, value: float | None, hit: bool) -> None:
        if self.reference is None:
            if value is not None:
                self._warm_values.append(value)
            self._warm_hits.append(hit)
            if len(self._warm_hits) >= self.window:
                self._end_warm_up()
            return
        if value is not None:
            self.values.append(value)
        self.hits.append(hit)

    def _end_warm_up(self) -> None:
        rate = sum(self._warm_hits) / len(self._warm_hits)
        if self._warm_values:
            self.reference, self.source = reference_of(self._warm_values, rate), "warm-up"
        self._warm_values, self._warm_hits = [], []

    def psi(self, min_samples: int) -> float | None:
        if self.reference is None or len(self.values) < min_samples:
            return None
        return psi(self.reference.shares, bin_counts(self.reference.edges, list(self.values)))

    def observed_rate(self) -> float | None:
        return sum(self.hits) / len(self.hits) if self.hits else None


class DriftMonitor:
    """The drift of one process's `auto` scores and cascade confidences (see the module's doc).

    `classifier_threshold`: a score at or above it is a strong call (the balanced mode's first
    threshold; None: routing by value, no strong-call share). Cascade confidences are kept per
    judged rung, each against its own reference: the `cascade_confidence` PSI is the largest
    over the rungs with `min_samples`, the escalation rates are over all judged answers (the
    predicted one weighs each rung's prediction by its answers in the window).
    """

    def __init__(
        self,
        *,
        window: int,
        min_samples: int,
        psi_alert: float,
        classifier_reference: DriftReference | None = None,
        classifier_threshold: float | None = None,
        rung_references: dict[str, DriftReference | None] | None = None,
        has_classifier: bool = True,
    ) -> None:
        self.window = window
        self.min_samples = min_samples
        self.psi_alert = psi_alert
        self.classifier_threshold = classifier_threshold
        self.classifier = SignalWindow(classifier_reference, window) if has_classifier else None
        self.rungs = {rung: SignalWindow(ref, window) for rung, ref in (rung_references or {}).items()}
        self.weak_wins: deque[bool] = deque(maxlen=window)  # graded shadow pairs (switchyard.learning)

    @classmethod
    def of(
        cls,
        thresholds: ThresholdsFile | None,
        *,
        window: int,
        min_samples: int,
        psi_alert: float,
        classifier_threshold: float | None,
        judged_rungs: Sequence[str],
        has_classifier: bool,
    ) -> DriftMonitor:
        """The monitor of a loaded version: its references from the thresholds file, when it has them."""
        routing = thresholds.routing if thresholds is not None else None
        cascade = thresholds.cascade if thresholds is not None else None
        fitted = cascade.rungs if cascade is not None else {}
        return cls(
            window=window,
            min_samples=min_samples,
            psi_alert=psi_alert,
            classifier_reference=routing.reference if routing is not None else None,
            classifier_threshold=classifier_threshold,
            rung_references={rung: (fitted[rung].reference if rung in fitted else None) for rung in judged_rungs},
            has_classifier=has_classifier,
        )

    def observe_score(self, score: float) -> None:
        if self.classifier is not None:
            threshold = self.classifier_threshold
            self.classifier.observe(score, threshold is not None and score >= threshold)

    def observe_confidence(self, rung: str, confidence: float | None, escalated: bool) -> None:
        window = self.rungs.get(rung)
        if window is not None:
            window.observe(confidence, escalated)

    def observe_label(self, weak_won: bool) -> None:
        """A graded shadow pair: the weak side's answer as good as the strong side's, or not."""
        self.weak_wins.append(weak_won)

    def readings(self) -> list[Reading]:
        out = []
        if self.classifier is not None:
            c = self.classifier
            has_rate = self.classifier_threshold is not None
            out.append(
                Reading(
                    CLASSIFIER_SCORE,
                    c.psi(self.min_samples),
                    c.observed_rate() if has_rate else None,
                    c.reference.rate if has_rate and c.reference is not None else None,
                    len(c.values),
                    c.source,
                    c.reference.num_samples if c.reference is not None else 0,
                )
            )
        if self.rungs:
            out.append(self._cascade_reading())
        if self.weak_wins:
            wins = self.weak_wins
            out.append(Reading(WEAK_WIN_RATE, None, sum(wins) / len(wins), None, len(wins), None, 0))
        return out

    def _cascade_reading(self) -> Reading:
        windows = list(self.rungs.values())
        psis = [p for w in windows if (p := w.psi(self.min_samples)) is not None]
        num_hits = sum(len(w.hits) for w in windows)
        observed = sum(sum(w.hits) for w in windows) / num_hits if num_hits else None
        weighed = [(len(w.hits), w.reference.rate) for w in windows if w.reference is not None and w.hits]
        predicted = (
            sum(n * r for n, r in weighed if r is not None) / sum(n for n, _ in weighed)
            if weighed and all(r is not None for _, r in weighed)
            else None
        )
        sources = {w.source for w in windows}
        source = None if None in sources else "file" if sources == {"file"} else "warm-up"
        return Reading(
            CASCADE_CONFIDENCE,
            max(psis) if psis else None,
            observed,
            predicted,
            sum(len(w.values) for w in windows),
            source,
            sum(w.reference.num_samples for w in windows if w.reference is not None),
        )
