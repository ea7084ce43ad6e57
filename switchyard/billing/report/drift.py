"""The report's Drift section: the period's classifier scores and cascade confidences, from the
ledger, against the loaded version's reference (the thresholds file's `reference` blocks; the PSI
as `/metrics` computes it, `switchyard.core.drift`).

A request's score is counted once (its first attempt's record carries it, as every attempt's
does); each judged rung's confidence once per judged answer (an answer without a confidence counts
toward the escalation rate only). Shadow calls are left out. Counts are kept per day and per
reference bin, so memory does not grow with the number of records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from switchyard.billing.records import UsageRecord
from switchyard.core.drift import CASCADE_CONFIDENCE, CLASSIFIER_SCORE, bin_of, psi
from switchyard.core.thresholds import DriftReference, ThresholdsFile

AUTO = "auto"  # the model column of the classifier's rows
Row = tuple[str | int | float | date | None, ...]  # a table's row (`tables.Row`, which imports this module)


@dataclass(frozen=True, slots=True)
class DriftReferences:
    """What the loaded version expects (`of` a thresholds file), and the bound the report flags."""

    classifier: DriftReference | None
    classifier_threshold: float | None  # a score at or above it is a strong call
    rungs: dict[str, DriftReference]  # judged rung -> its reference
    psi_alert: float = 0.2
    min_samples: int = 100  # per row of the report; fewer: no PSI

    @classmethod
    def of(cls, thresholds: ThresholdsFile | None, *, psi_alert: float, min_samples: int) -> DriftReferences | None:
        """None: the file has no reference block (the report then says so)."""
        routing = thresholds.routing if thresholds is not None else None
        cascade = thresholds.cascade if thresholds is not None else None
        rungs = {name: rung.reference for name, rung in (cascade.rungs if cascade else {}).items() if rung.reference}
        classifier = routing.reference if routing is not None else None
        if classifier is None and not rungs:
            return None
        values = routing.values() if routing is not None else []
        return cls(classifier, values[0] if values else None, rungs, psi_alert, min_samples)


@dataclass(slots=True)
class _Counts:
    bins: list[int]
    num_values: int = 0  # in a bin: not an answer without confidence
    num_judged: int = 0
    num_hits: int = 0  # strong calls, or escalations

    def add(self, other: _Counts) -> None:
        self.bins = [a + b for a, b in zip(self.bins, other.bins, strict=True)]
        self.num_values += other.num_values
        self.num_judged += other.num_judged
        self.num_hits += other.num_hits


@dataclass(slots=True)
class DriftSums:
    references: DriftReferences
    by_day: dict[tuple[date, str, str], _Counts] = field(default_factory=dict)  # (day, signal, model)

    def add(self, record: UsageRecord, day: date) -> None:
        if record.is_shadow:
            return
        refs = self.references
        if record.score is not None and record.attempt == 1 and refs.classifier is not None:
            threshold = refs.classifier_threshold
            self._count(
                day,
                CLASSIFIER_SCORE,
                AUTO,
                refs.classifier,
                record.score,
                threshold is not None and record.score >= threshold,
            )
        if record.threshold is not None and record.model in refs.rungs:
            escalated = record.confidence is None or record.confidence < record.threshold
            self._count(day, CASCADE_CONFIDENCE, record.model, refs.rungs[record.model], record.confidence, escalated)

    def _count(
        self, day: date, signal: str, model: str, reference: DriftReference, value: float | None, hit: bool
    ) -> None:
        counts = self.by_day.get((day, signal, model))
        if counts is None:
            counts = self.by_day[(day, signal, model)] = _Counts([0] * len(reference.shares))
        counts.num_judged += 1
        counts.num_hits += hit
        if value is not None:
            counts.num_values += 1
            counts.bins[bin_of(reference.edges, value)] += 1

    def reference_of(self, signal: str, model: str) -> DriftReference:
        refs = self.references
        reference = refs.classifier if signal == CLASSIFIER_SCORE else refs.rungs.get(model)
        assert reference is not None  # only counted with one
        return reference

    def totals(self) -> dict[tuple[str, str], _Counts]:
        """(signal, model) -> the period's counts."""
        out: dict[tuple[str, str], _Counts] = {}
        for (_, signal, model), counts in sorted(self.by_day.items()):
            total = out.setdefault((signal, model), _Counts([0] * len(counts.bins)))
            total.add(counts)
        return out

    def psi_of(self, signal: str, model: str, counts: _Counts) -> float | None:
        if counts.num_values < self.references.min_samples:
            return None
        return psi(self.reference_of(signal, model).shares, counts.bins)


DRIFT_COLUMNS = (
    "signal", "model", "answers", "binned", "psi", "psi_alert", "observed_rate", "predicted_rate",
    "reference_samples",
)  # fmt: skip
DRIFT_BY_DAY_COLUMNS = ("day", "signal", "model", "answers", "binned", "psi", "observed_rate")
DRIFT_BINS_COLUMNS = ("signal", "model", "bin", "bin_low", "bin_high", "reference_share", "observed_share")


def drift_rows(sums: DriftSums | None) -> dict[str, list[Row]]:
    """The rows of the tables drift, drift_by_day and drift_bins (empty without a reference)."""
    rows: dict[str, list[Row]] = {"drift": [], "drift_by_day": [], "drift_bins": []}
    if sums is None:
        return rows
    refs = sums.references
    for (signal, model), counts in sums.totals().items():
        reference = sums.reference_of(signal, model)
        rows["drift"].append(
            (
                signal, model, counts.num_judged, counts.num_values, sums.psi_of(signal, model, counts),
                refs.psi_alert, counts.num_hits / counts.num_judged if counts.num_judged else None,
                reference.rate if signal == CASCADE_CONFIDENCE or refs.classifier_threshold is not None else None,
                reference.num_samples,
            )
        )  # fmt: skip
        edges = [None, *reference.edges, None]
        for i, share in enumerate(reference.shares):
            observed = counts.bins[i] / counts.num_values if counts.num_values else None
            rows["drift_bins"].append((signal, model, i, edges[i], edges[i + 1], share, observed))
    for (day, signal, model), counts in sorted(sums.by_day.items()):
        rate = counts.num_hits / counts.num_judged if counts.num_judged else None
        rows["drift_by_day"].append(
            (day, signal, model, counts.num_judged, counts.num_values, sums.psi_of(signal, model, counts), rate)
        )
    return rows


def drift_summary(sums: DriftSums | None) -> dict[str, object] | None:
    """summary.json's `drift`: each (signal, model)'s PSI and rates over the period, which pass the
    bound over the period (`over_alert`) and on which days (`days_over_alert`)."""
    if sums is None:
        return None
    bound = sums.references.psi_alert
    rows = drift_rows(sums)
    signals: dict[str, dict[str, object]] = {}
    for signal, model, answers, _, index, _, observed, predicted, _ in rows["drift"]:
        signals[f"{signal}:{model}"] = {
            "answers": answers, "psi": index, "observed_rate": observed, "predicted_rate": predicted,
        }  # fmt: skip
    over = [name for name, values in signals.items() if _is_over(values["psi"], bound)]
    days = [
        {"day": str(day), "signal": f"{signal}:{model}", "psi": index}
        for day, signal, model, _, _, index, _ in rows["drift_by_day"]
        if _is_over(index, bound)
    ]
    return {"psi_alert": bound, "signals": signals, "over_alert": over, "days_over_alert": days}


def _is_over(index: object, bound: float) -> bool:
    return isinstance(index, float) and index > bound


def new_drift_sums(references: DriftReferences | None) -> DriftSums | None:
    return DriftSums(references) if references is not None else None


__all__ = ["DriftReferences", "DriftSums", "drift_rows", "drift_summary", "new_drift_sums"]
