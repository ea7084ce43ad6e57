"""Tuning the cascade offline: how confidence in the weak model's answer should decide escalation.

A cascade answers every prompt with the weak model and escalates those whose confidence is below
a threshold: an escalated prompt costs both answers and gets the strong model's quality. On the
train split this module picks the scorer (one feature or the learned one) and the threshold; on
the test split it reports quality, cost, escalation rate and the AUROC of confidence against the
weak answer being right (quality >= 0.5).

Works on any trace file: a trace whose weak answer has no logprobs cannot be judged and is always
escalated; a file with no `split` fields is split 80/20 by prompt hash (and says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from switchyard.cascade.confidence import (
    DEFAULT_FIRST_K,
    FEATURE_NAMES,
    FeatureScorer,
    Scorer,
    evidence_from_trace,
    feature_matrix,
    fit_logistic,
)
from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.evaluate import EvalError, Outcomes

ACCEPTABLE_QUALITY = 0.5


@dataclass(frozen=True, slots=True)
class CascadeData:
    """Per prompt: both models' quality and cost, and the weak answer's confidence features."""

    traces: list[Trace]
    q_weak: np.ndarray
    q_strong: np.ndarray
    c_weak: np.ndarray
    c_strong: np.ndarray
    features: np.ndarray  # rows of FEATURE_NAMES; NaN rows: no logprobs

    @classmethod
    def of(cls, traces: Sequence[Trace], weak: str, strong: str, first_k: int = DEFAULT_FIRST_K) -> CascadeData:
        outcomes = Outcomes.of(traces, weak, strong)
        evidence = [
            evidence_from_trace(t.models[weak].token_logprobs, t.models[weak].top_logprobs) for t in outcomes.traces
        ]
        return cls(
            outcomes.traces,
            outcomes.q_weak,
            outcomes.q_strong,
            outcomes.c_weak,
            outcomes.c_strong,
            feature_matrix(evidence, first_k),
        )

    @property
    def acceptable(self) -> np.ndarray:
        return (self.q_weak >= ACCEPTABLE_QUALITY).astype(int)

    @property
    def has_evidence(self) -> np.ndarray:
        return ~np.isnan(self.features).any(axis=1)

    def confidence(self, scorer: Scorer) -> np.ndarray:
        """The scorer's confidence per prompt; -inf where there is nothing to judge."""
        out = np.full(len(self.traces), -np.inf)
        rows = self.has_evidence
        if rows.any():
            out[rows] = scorer.score_matrix(self.features[rows])
        return out


@dataclass(frozen=True, slots=True)
class CascadeCurve:
    """Operating points as the threshold rises from 'never escalate' to 'always escalate'.

    Point i escalates prompts with confidence < thresholds[i]; ties move together.
    """

    thresholds: np.ndarray
    escalation_rate: np.ndarray
    quality: np.ndarray
    cost_usd: np.ndarray


def _midpoints(ordered: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per run of equal values (starting at `ends[:-1]`), a threshold between it and the run below."""
    firsts = ordered[ends[:-1]]
    below = np.concatenate([[-np.inf], firsts[:-1]])
    finite = firsts[np.isfinite(firsts)]
    gap = float(finite[1] - finite[0]) / 2 if len(finite) > 1 else 0.5
    with np.errstate(invalid="ignore"):
        middle = (below + firsts) / 2
    first_finite = np.isfinite(firsts) & ~np.isfinite(below)
    return np.where(first_finite, firsts - gap, np.where(np.isfinite(firsts), middle, firsts))


def cascade_curve(confidence: np.ndarray, data: CascadeData) -> CascadeCurve:
    n = len(confidence)
    order = np.argsort(confidence, kind="stable")
    ordered = confidence[order]
    gain_q = (data.q_strong - data.q_weak)[order]
    gain_c = data.c_strong[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    ends = np.concatenate([[0], cuts, [n]])
    cum_q = np.concatenate([[0.0], np.cumsum(gain_q)])[ends]
    cum_c = np.concatenate([[0.0], np.cumsum(gain_c)])[ends]
    # Escalate when confidence < threshold: halfway between the last value escalated and the first
    # kept (a threshold on a value itself moved that value's ties across when rounded to be
    # written), or +inf past the end. Answers with nothing to judge (-inf) are always escalated, as
    # the proxy does; the point that keeps every other answer sits as far under the smallest
    # finite value as the next one above it (or 0.5).
    thresholds = np.concatenate([_midpoints(ordered, ends), [np.inf]])
    start = 1 if n and ordered[0] == -np.inf else 0
    return CascadeCurve(
        thresholds=thresholds[start:],
        escalation_rate=ends[start:] / n,
        quality=(data.q_weak.sum() + cum_q[start:]) / n,
        cost_usd=(data.c_weak.sum() + cum_c[start:]) / n,
    )


def pick_threshold(
    curve: CascadeCurve, data: CascadeData, *, quality_fraction=None, max_cost_usd=None, best_quality=False
) -> int:
    """The index of the curve point that meets the target most cheaply (or comes closest);
    `best_quality`: the highest quality on the curve, the cheapest such point."""
    if best_quality:
        return int(np.flatnonzero(curve.quality >= curve.quality.max() - 1e-12)[0])
    if (quality_fraction is None) == (max_cost_usd is None):
        raise EvalError("give exactly one target: --target-quality, --max-cost or --best-quality")
    if quality_fraction is not None:
        reached = np.flatnonzero(curve.quality >= quality_fraction * data.q_strong.mean() - 1e-12)
        if len(reached):
            return int(reached[np.argmin(curve.cost_usd[reached])])
        return int(np.argmax(curve.quality))
    allowed = np.flatnonzero(curve.cost_usd <= max_cost_usd + 1e-15)
    if not len(allowed):
        return int(np.argmin(curve.cost_usd))
    best = curve.quality[allowed].max()
    return int(allowed[np.flatnonzero(curve.quality[allowed] >= best - 1e-12)][0])


class OperatingPoint(TypedDict):
    """The cascade at one threshold; `auroc` and `pgr` are None where they are undefined."""

    quality: float
    cost_usd: float
    escalation_rate: float
    auroc: float | None
    pgr: float | None
    quality_weak: float
    quality_strong: float
    cost_weak_usd: float
    cost_strong_usd: float
    num_prompts: int
    num_unjudged: int


def operating_point(data: CascadeData, confidence: np.ndarray, threshold: float) -> OperatingPoint:
    escalate = confidence < threshold
    quality = float(np.where(escalate, data.q_strong, data.q_weak).mean())
    cost = float((data.c_weak + escalate * data.c_strong).mean())
    qw, qs = float(data.q_weak.mean()), float(data.q_strong.mean())
    return {
        "quality": round(quality, 6),
        "cost_usd": round(cost, 9),
        "escalation_rate": round(float(escalate.mean()), 6),
        "auroc": _round(metrics.auroc(confidence, data.acceptable.astype(bool))),
        "pgr": _round(float(metrics.pgr(quality, qw, qs))),
        "quality_weak": round(qw, 6),
        "quality_strong": round(qs, 6),
        "cost_weak_usd": round(float(data.c_weak.mean()), 9),
        "cost_strong_usd": round(float(data.c_strong.mean()), 9),
        "num_prompts": len(data.traces),
        "num_unjudged": int((~data.has_evidence).sum()),
    }


def _round(value: float) -> float | None:
    return None if np.isnan(value) else round(value, 6)


def feature_aurocs(data: CascadeData, first_k: int) -> dict[str, float | None]:
    """Each single feature's AUROC against a correct weak answer, over answers that carry logprobs."""
    rows = data.has_evidence
    labels = data.acceptable[rows] == 1
    return {
        feature: _round(metrics.auroc(FeatureScorer(feature, first_k).score_matrix(data.features[rows]), labels))
        for feature in FEATURE_NAMES
    }


def fit_scorer(name: str, train: CascadeData, first_k: int, seed: int = 0) -> tuple[Scorer, dict[str, float | None]]:
    """The scorer called `name` ("auto": the best by train AUROC; "learned"; or a feature) and every
    candidate's train AUROC (the learned scorer's by 5-fold cross-validation)."""
    labels = train.acceptable
    rows = train.has_evidence
    if not rows.any():
        raise EvalError("no weak answer in the train split carries token_logprobs: the cascade has nothing to judge")
    candidates = feature_aurocs(train, first_k)
    candidates["learned"] = _cv_auroc(train.features[rows], labels[rows], first_k, seed)
    if name == "auto":
        scored = {k: v for k, v in candidates.items() if v is not None}
        if not scored:
            raise EvalError("the train split's weak answers are all right or all wrong: confidence cannot be fitted")
        name = max(scored, key=lambda k: (scored[k], k == "learned"))
    if name == "learned":
        try:
            return fit_logistic(train.features, labels, first_k), candidates
        except ValueError as exc:
            raise EvalError(str(exc)) from exc
    try:
        return FeatureScorer(name, first_k), candidates
    except ValueError as exc:
        raise EvalError(str(exc)) from exc


def _cv_auroc(x: np.ndarray, y: np.ndarray, first_k: int, seed: int, folds: int = 5) -> float | None:
    if min(int(y.sum()), int(len(y) - y.sum())) < folds:
        return None
    rng = np.random.default_rng(seed)
    fold_of = rng.permutation(len(y)) % folds
    predicted = np.empty(len(y))
    for k in range(folds):
        held = fold_of == k
        if len(set(y[~held].tolist())) < 2:
            return None
        predicted[held] = fit_logistic(x[~held], y[~held], first_k).score_matrix(x[held])
    return _round(metrics.auroc(predicted, y == 1))


@dataclass(slots=True)
class CascadeReport:
    weak: str
    strong: str
    scorer: Scorer
    threshold: float
    target: dict[str, float]
    train: OperatingPoint
    test: OperatingPoint
    train_auroc: dict[str, float | None]
    test_auroc: dict[str, float | None]
    curve: CascadeCurve
    chosen: int
    notes: list[str] = field(default_factory=list)

    def to_json(self, max_points: int = 101) -> dict:
        index = np.unique(np.linspace(0, len(self.curve.quality) - 1, min(max_points, len(self.curve.quality))).round())
        index = index.astype(int)
        return {
            "weak_model": self.weak,
            "strong_model": self.strong,
            "scorer": self.scorer.to_dict(),
            "threshold": _finite(self.threshold),
            "target": self.target,
            "train": self.train,
            "test": self.test,
            "auroc_by_scorer": {"train": self.train_auroc, "test": self.test_auroc},
            "curve": {
                "escalation_rate": [round(float(x), 6) for x in self.curve.escalation_rate[index]],
                "quality": [round(float(x), 6) for x in self.curve.quality[index]],
                "cost_usd": [float(x) for x in self.curve.cost_usd[index]],
            },
            "notes": self.notes,
        }


def _finite(value: float) -> float | str:
    """YAML and JSON both hold a finite number; an infinite threshold is written as a string."""
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(float(value), 8)


def tune(
    train: CascadeData,
    test: CascadeData,
    weak: str,
    strong: str,
    *,
    scorer_name: str = "auto",
    first_k: int = DEFAULT_FIRST_K,
    quality_fraction: float | None = None,
    max_cost_usd: float | None = None,
    best_quality: bool = False,
) -> CascadeReport:
    scorer, train_auroc = fit_scorer(scorer_name, train, first_k)
    train_conf = train.confidence(scorer)
    train_curve = cascade_curve(train_conf, train)
    index = pick_threshold(
        train_curve, train, quality_fraction=quality_fraction, max_cost_usd=max_cost_usd, best_quality=best_quality
    )
    threshold = float(train_curve.thresholds[index])
    test_conf = test.confidence(scorer)
    test_curve = cascade_curve(test_conf, test)
    test_point = operating_point(test, test_conf, threshold)
    chosen = int(np.argmin(np.abs(test_curve.escalation_rate - test_point["escalation_rate"])))
    test_auroc = feature_aurocs(test, first_k)
    if scorer.name == "learned":
        test_auroc["learned"] = test_point["auroc"]
    if best_quality:
        target: dict = {"best_quality": True}
    elif quality_fraction is not None:
        target = {"quality_fraction": quality_fraction}
    else:
        target = {"max_cost_usd": max_cost_usd}
    notes = []
    if quality_fraction is not None and train.q_strong.mean() <= train.q_weak.mean():
        notes.append(
            f"{strong} is no better than {weak} on the train split ({train.q_strong.mean():.3f} vs "
            f"{train.q_weak.mean():.3f}): a target relative to it is met without escalating; try --best-quality"
        )
    return CascadeReport(
        notes=notes,
        weak=weak,
        strong=strong,
        scorer=scorer,
        threshold=threshold,
        target=target,
        train=operating_point(train, train_conf, threshold),
        test=test_point,
        train_auroc=train_auroc,
        test_auroc=test_auroc,
        curve=test_curve,
        chosen=chosen,
    )
