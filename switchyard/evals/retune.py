"""Re-tuning `auto` and the cascade on a company's own labelled rows (`switchyard eval retune`).

Rows are split by time: everything is fitted on the older part, and judged on the newer, which
plays the traffic to come. For each part (routing, cascade) the current setting and the re-tuned
one are compared by the cost of reaching the target quality along their held-out cost-quality
curve; a seeded bootstrap over the held-out rows gives the difference's 95% interval, and a part
counts as better only when that interval lies above zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import logit

from switchyard.cascade.confidence import Scorer
from switchyard.classifier.model import ArtifactError, ComplexityClassifier, design_matrix_of
from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.cascade import CascadeData, CascadeReport, cascade_curve, tune
from switchyard.evals.cascade import operating_point as cascade_point
from switchyard.evals.drift_reference import escalation_reference, strong_share_reference
from switchyard.evals.evaluate import EvalError, Outcomes
from switchyard.evals.one_blas_thread import one_blas_thread
from switchyard.evals.retune_head import HeadFit, fit_residual_head
from switchyard.evals.retune_rows import TimedRows, embedded_rows
from switchyard.evals.thresholds import operating_point, pick_threshold

NUM_RESAMPLES = 1000
MIN_PART_ROWS = 10  # fit and held-out rows a part needs


@dataclass(frozen=True, slots=True)
class CurrentRouting:
    """What `auto` serves now: its artifact, and per quality mode its threshold and target."""

    artifact: Path
    thresholds: dict[str, float]  # mode -> threshold (two tiers: one each)
    targets: dict[str, dict[str, float]]  # mode -> {"quality_fraction": …} or {"max_strong_share": …}


@dataclass(frozen=True, slots=True)
class CurrentCascade:
    scorer: Scorer
    threshold: float
    first_k: int


@dataclass(frozen=True, slots=True)
class Comparison:
    """Cost (USD per 1k prompts) of reaching the target quality on the held-out rows."""

    target_quality: float
    before: float
    after: float
    ci95: tuple[float, float]  # of before - after, over bootstrap resamples of the held-out rows

    @property
    def is_better(self) -> bool:
        return self.ci95[0] > 0


@dataclass(slots=True)
class RoutingRetune:
    fit: HeadFit
    classifier: ComplexityClassifier | None  # the re-tuned one; None: the shipped head stays
    thresholds: dict[str, float]  # mode -> the new threshold, picked on the fit rows
    before: dict[str, float]  # the balanced mode's held-out operating point, current setting
    after: dict[str, float]
    comparison: Comparison
    num_fit: int
    num_held_out: int
    curves: tuple[metrics.Curve, metrics.Curve]  # held-out, before and after
    targets: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> its target
    train: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> fit-rows operating point
    test: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> held-out operating point
    reference: dict[str, Any] = field(default_factory=dict)  # drift reference: held-out scores, balanced threshold


@dataclass(slots=True)
class CascadeRetune:
    report: CascadeReport  # the re-tuned scorer and threshold, with its fit and held-out points
    before: dict[str, Any]
    comparison: Comparison
    curves: tuple[Any, Any]  # held-out CascadeCurves, before and after
    reference: dict[str, Any] = field(default_factory=dict)  # drift reference: held-out confidences


@dataclass(slots=True)
class RetuneResult:
    routing: RoutingRetune | None
    cascade: CascadeRetune | None
    skipped: dict[str, str]  # part -> why it was not re-tuned


@one_blas_thread
def retune(
    timed: TimedRows,
    weak: str,
    strong: str,
    *,
    routing: CurrentRouting | None,
    cascade: CurrentCascade | None,
    target_quality: float,
    seed: int = 0,
    skipped: dict[str, str] | None = None,
) -> RetuneResult:
    skipped = dict(skipped or {})
    routing_result = cascade_result = None
    if routing is not None:
        try:
            routing_result = retune_routing(timed, weak, strong, routing, target_quality, seed)
        except _Skip as reason:
            skipped["routing"] = str(reason)
    if cascade is not None:
        try:
            cascade_result = retune_cascade(timed, weak, strong, cascade, target_quality, seed)
        except _Skip as reason:
            skipped["cascade"] = str(reason)
    if routing_result is None and cascade_result is None:
        raise EvalError("nothing to re-tune: " + "; ".join(f"{part}: {why}" for part, why in skipped.items()))
    return RetuneResult(routing_result, cascade_result, skipped)


class _Skip(Exception):
    """A part the rows cannot re-tune (the message says why); the other part may still."""


def retune_routing(
    timed: TimedRows, weak: str, strong: str, current: CurrentRouting, target_quality: float, seed: int
) -> RoutingRetune:
    has, embeddings, features = embedded_rows(timed.rows)
    is_fit = np.arange(len(timed.rows)) < timed.cut
    fit_rows, held_rows = np.flatnonzero(has & is_fit), np.flatnonzero(has & ~is_fit)
    if min(len(fit_rows), len(held_rows)) < MIN_PART_ROWS:
        raise _Skip(
            f"{has.sum()} of {len(timed.rows)} rows carry the classifier's embedding and features "
            f"({len(fit_rows)} to fit, {len(held_rows)} held out; each needs {MIN_PART_ROWS})"
        )
    try:
        shipped = ComplexityClassifier.load(current.artifact)
    except ArtifactError as exc:
        raise EvalError(str(exc)) from exc
    x = design_matrix_of(embeddings, features, shipped.subject_prior)
    base = shipped.score_design(x)
    embedded = np.flatnonzero(has)
    fit_at, held_at = np.searchsorted(embedded, fit_rows), np.searchsorted(embedded, held_rows)
    fit = Outcomes.of([timed.rows[i] for i in fit_rows], weak, strong)
    held = Outcomes.of([timed.rows[i] for i in held_rows], weak, strong)
    y = (fit.q_strong > fit.q_weak).astype(float)
    head_fit = fit_residual_head(shipped.head, x[fit_at], y, logit(np.clip(base[fit_at], 1e-6, 1 - 1e-6)))
    scores = head_fit.head.score(x) if head_fit.head is not None else base
    thresholds, train, test = {}, {}, {}
    for mode, target in current.targets.items():
        thresholds[mode] = pick_threshold(fit, scores[fit_at], **target)
        train[mode] = operating_point(fit, scores[fit_at], thresholds[mode])
        test[mode] = operating_point(held, scores[held_at], thresholds[mode])
    before_scores, after_scores = base[held_at], scores[held_at]
    before = _routing_point(held, before_scores, current.thresholds["balanced"], target_quality)
    after = _routing_point(held, after_scores, thresholds["balanced"], target_quality)

    def saving(index: np.ndarray) -> float:
        target = target_quality * float(held.q_strong[index].mean())
        return 1000 * (
            metrics.cost_at_quality(_routing_curve(held, before_scores, index), target)
            - metrics.cost_at_quality(_routing_curve(held, after_scores, index), target)
        )

    classifier = None
    if head_fit.head is not None:
        metadata = {**shipped.metadata, "retuned": {"base_artifact": str(current.artifact), "l2": head_fit.l2}}
        classifier = ComplexityClassifier(head_fit.head, metadata, shipped.embedder, shipped.subject_prior)
    return RoutingRetune(
        fit=head_fit,
        classifier=classifier,
        thresholds=thresholds,
        before=before,
        after=after,
        comparison=Comparison(
            target_quality,
            before["cost_at_target_usd_per_1k"],
            after["cost_at_target_usd_per_1k"],
            bootstrap_interval(len(held_rows), saving, seed),
        ),
        num_fit=len(fit_rows),
        num_held_out=len(held_rows),
        curves=(held.curve(before_scores), held.curve(after_scores)),
        targets=dict(current.targets),
        train=train,
        test=test,
        reference=strong_share_reference(after_scores, thresholds["balanced"]),
    )


def _routing_curve(outcomes: Outcomes, scores: np.ndarray, index: np.ndarray) -> metrics.Curve:
    return metrics.routing_curve(
        scores[index],
        outcomes.q_weak[index],
        outcomes.q_strong[index],
        outcomes.c_weak[index],
        outcomes.c_strong[index],
    )


def _routing_point(outcomes: Outcomes, scores: np.ndarray, threshold: float, target_quality: float) -> dict[str, float]:
    curve = outcomes.curve(scores)
    return {
        **operating_point(outcomes, scores, threshold),
        "apgr": round(metrics.apgr(curve, outcomes.quality_weak, outcomes.quality_strong), 6),
        "cost_at_target_usd_per_1k": round(
            1000 * metrics.cost_at_quality(curve, target_quality * outcomes.quality_strong), 6
        ),
    }


def retune_cascade(
    timed: TimedRows, weak: str, strong: str, current: CurrentCascade, target_quality: float, seed: int
) -> CascadeRetune:
    def judged(rows: list[Trace]) -> list[Trace]:
        return [t for t in rows if t.models[weak].token_logprobs]

    fit_rows, held_rows = judged(timed.fit), judged(timed.held_out)
    if min(len(fit_rows), len(held_rows)) < MIN_PART_ROWS:
        raise _Skip(
            f"{len(fit_rows) + len(held_rows)} of {len(timed.rows)} rows carry {weak}'s token logprobs "
            f"({len(fit_rows)} to fit, {len(held_rows)} held out; each needs {MIN_PART_ROWS})"
        )
    fit = CascadeData.of(fit_rows, weak, strong, current.first_k)
    held = CascadeData.of(held_rows, weak, strong, current.first_k)
    if len(set(fit.acceptable.tolist())) < 2:
        raise _Skip(f"{weak}'s answers in the fit rows are all right or all wrong: confidence cannot be fitted")
    report = tune(fit, held, weak, strong, first_k=current.first_k, quality_fraction=target_quality)
    before_conf, after_conf = held.confidence(current.scorer), held.confidence(report.scorer)
    before = dict(cascade_point(held, before_conf, current.threshold))
    before_curve, after_curve = cascade_curve(before_conf, held), cascade_curve(after_conf, held)

    def cost_at_target(curve) -> float:
        return 1000 * metrics.cost_at_quality(curve, target_quality * float(held.q_strong.mean()))

    def saving(index: np.ndarray) -> float:
        sample = _take(held, index)
        target = target_quality * float(sample.q_strong.mean())
        return 1000 * (
            metrics.cost_at_quality(cascade_curve(before_conf[index], sample), target)
            - metrics.cost_at_quality(cascade_curve(after_conf[index], sample), target)
        )

    return CascadeRetune(
        report=report,
        before=before,
        comparison=Comparison(
            target_quality,
            round(cost_at_target(before_curve), 9),
            round(cost_at_target(after_curve), 9),
            bootstrap_interval(len(held_rows), saving, seed),
        ),
        curves=(before_curve, after_curve),
        reference=escalation_reference(after_conf, report.threshold),
    )


def _take(data: CascadeData, index: np.ndarray) -> CascadeData:
    return CascadeData(
        [data.traces[i] for i in index],
        data.q_weak[index],
        data.q_strong[index],
        data.c_weak[index],
        data.c_strong[index],
        data.features[index],
    )


def bootstrap_interval(
    num_rows: int, statistic: Callable[[np.ndarray], float], seed: int, num_resamples: int = NUM_RESAMPLES
) -> tuple[float, float]:
    """The 95% percentile interval of `statistic` over resamples (with replacement) of the rows."""
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, num_rows, num_rows)) for _ in range(num_resamples)])
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return round(float(low), 9), round(float(high), 9)
