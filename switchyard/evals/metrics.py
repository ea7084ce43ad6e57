"""Routing and confidence metrics on arrays; every function is small enough to check by hand.

Conventions: a decision vector holds 1 where a prompt goes to the strong model. PGR (performance
gap recovered) normalises quality so that always-weak is 0 and always-strong is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


def decision_quality(decisions: np.ndarray, q_weak: np.ndarray, q_strong: np.ndarray) -> float:
    d = np.asarray(decisions, dtype=float)
    return float(np.mean(d * q_strong + (1 - d) * q_weak))


def decision_cost(decisions: np.ndarray, c_weak: np.ndarray, c_strong: np.ndarray) -> float:
    """Mean cost per prompt in USD."""
    d = np.asarray(decisions, dtype=float)
    return float(np.mean(d * c_strong + (1 - d) * c_weak))


@dataclass(frozen=True, slots=True)
class Curve:
    """A router's operating points as its threshold sweeps from 'all weak' to 'all strong'.

    `thresholds[i]` is the score at or above which prompts go strong to reach point i (point 0,
    no strong calls, has +inf). Tied scores move together; their points are the expectation over
    the order of the tie, which is the straight line between the points either side of it.
    """

    strong_share: np.ndarray
    quality: np.ndarray
    cost_usd: np.ndarray
    thresholds: np.ndarray


def routing_curve(
    scores: np.ndarray, q_weak: np.ndarray, q_strong: np.ndarray, c_weak: np.ndarray, c_strong: np.ndarray
) -> Curve:
    scores = np.asarray(scores, dtype=float)
    n = len(scores)
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    gain_q = (q_strong - q_weak)[order]
    gain_c = (c_strong - c_weak)[order]
    # Cut only between distinct scores: a threshold cannot split a tie.
    cuts = np.flatnonzero(np.diff(sorted_scores) != 0) + 1
    ends = np.concatenate([[0], cuts, [n]])
    cum_q = np.concatenate([[0.0], np.cumsum(gain_q)])[ends]
    cum_c = np.concatenate([[0.0], np.cumsum(gain_c)])[ends]
    thresholds = np.concatenate([[np.inf], sorted_scores[ends[1:] - 1]])
    return Curve(
        strong_share=ends / n,
        quality=(q_weak.sum() + cum_q) / n,
        cost_usd=(c_weak.sum() + cum_c) / n,
        thresholds=thresholds,
    )


def pgr(quality: np.ndarray | float, quality_weak: float, quality_strong: float) -> np.ndarray:
    gap = quality_strong - quality_weak
    if gap <= 0:
        return np.full_like(np.asarray(quality, dtype=float), np.nan)
    return (np.asarray(quality, dtype=float) - quality_weak) / gap


def apgr(curve: Curve, quality_weak: float, quality_strong: float) -> float:
    """Area under PGR vs strong-call share (trapezoids; exact for the tie-expectation curve)."""
    return float(np.trapezoid(pgr(curve.quality, quality_weak, quality_strong), curve.strong_share))


def cpt(curve: Curve, fraction: float, quality_weak: float, quality_strong: float) -> float:
    """The smallest strong-call share that recovers `fraction` of the quality gap (nan if never)."""
    gains = pgr(curve.quality, quality_weak, quality_strong)
    return _first_crossing(curve.strong_share, gains, fraction)


class CostQualityCurve(Protocol):
    """A routing `Curve` or the cascade's: cost and quality along it, cheapest first."""

    @property
    def cost_usd(self) -> np.ndarray: ...

    @property
    def quality(self) -> np.ndarray: ...


def cost_at_quality(curve: CostQualityCurve, target_quality: float) -> float:
    """The lowest mean cost per prompt on the curve whose quality reaches `target_quality`."""
    return _first_crossing(curve.cost_usd, curve.quality, target_quality)


def strong_share_at_quality(curve: Curve, target_quality: float) -> float:
    """The smallest strong-call share on the curve whose quality reaches `target_quality`."""
    return _first_crossing(curve.strong_share, curve.quality, target_quality)


def _first_crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """x where y first reaches target, walking the polyline in order and interpolating."""
    if len(y) and y[0] >= target:
        return float(x[0])
    for i in range(1, len(y)):
        if y[i] >= target > y[i - 1]:
            t = (target - y[i - 1]) / (y[i] - y[i - 1])
            return float(x[i - 1] + t * (x[i] - x[i - 1]))
    return float("nan")


def upper_hull(costs: np.ndarray, qualities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The upper-left convex hull of (cost, quality) points, as the best mix of operating points."""
    points = sorted(zip(np.asarray(costs, float), np.asarray(qualities, float), strict=True))
    hull: list[tuple[float, float]] = []
    for point in points:
        if hull and point[0] == hull[-1][0]:
            if point[1] <= hull[-1][1]:
                continue
            hull.pop()
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (point[1] - y1) - (y2 - y1) * (point[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(point)
    # Paying more for less is never on the frontier: quality only rises along it.
    frontier = [hull[0]]
    for point in hull[1:]:
        if point[1] > frontier[-1][1]:
            frontier.append(point)
    xs, ys = zip(*frontier, strict=True)
    return np.array(xs), np.array(ys)


def aiq(costs: np.ndarray, qualities: np.ndarray, cost_low: float, cost_high: float) -> float:
    """Average quality over [cost_low, cost_high] under the convex hull (AIQ, Hu et al. 2024)."""
    hull_c, hull_q = upper_hull(costs, qualities)
    grid = np.linspace(cost_low, cost_high, 2001)
    values = np.interp(grid, hull_c, hull_q, left=np.nan, right=hull_q[-1])
    values = np.where(np.isnan(values), hull_q[0] if cost_low >= hull_c[0] else 0.0, values)
    return float(np.trapezoid(values, grid) / (cost_high - cost_low))


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting one half (Mann-Whitney)."""
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels, dtype=bool)
    num_pos, num_neg = int(labels.sum()), int((~labels).sum())
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))
