"""Fitting a `ResidualHead` over the shipped head on labelled rows (`switchyard eval retune`).

Candidates: the shipped head as it is, and the residual correction at a few L2 strengths (strong:
close to the shipped head; weak: mostly the rows' own signal). Each is fitted on the older three
quarters of the fit rows and judged by its log loss on the newest quarter; the winner is fitted
again on all of them. Losing to the shipped head is a result, not a failure: the rows then hold
nothing the head can learn, and the shipped artifact stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from switchyard.classifier.residual_head import ResidualHead

L2_STRENGTHS = (1.0, 0.3, 0.1, 0.03, 0.01)
INNER_SHARE = 0.25  # of the fit rows, the newest, that choose among the candidates
MIN_INNER_ROWS = 20


@dataclass(frozen=True, slots=True)
class HeadFit:
    head: ResidualHead | None  # None: the shipped head as it is
    l2: float | None
    inner_log_loss: dict[str, float]  # candidate -> log loss on the newest fit rows


def fit_residual_head(base, x: np.ndarray, y: np.ndarray, base_logits: np.ndarray) -> HeadFit:
    """`x`, `y`, `base_logits`: the fit rows, oldest first (the shipped head's logit per row)."""
    n_inner = int(round(len(y) * INNER_SHARE))
    losses: dict[str, float] = {}
    if n_inner >= MIN_INNER_ROWS and len(set(y[:-n_inner].tolist())) == 2:
        older, newer = slice(0, len(y) - n_inner), slice(len(y) - n_inner, len(y))
        for l2 in (None, *L2_STRENGTHS):
            params = _fit(x[older], y[older], base_logits[older], l2)
            losses[_label(l2)] = _log_loss(params, x[newer], y[newer], base_logits[newer])
    if not losses or min(losses, key=losses.__getitem__) == _label(None):
        return HeadFit(None, None, losses)
    best = min(losses, key=losses.__getitem__)
    l2 = next(value for value in L2_STRENGTHS if _label(value) == best)
    mean, scale, slope, intercept, coef = _fit(x, y, base_logits, l2)
    return HeadFit(ResidualHead(base, slope, intercept, mean, scale, coef), l2, losses)


def _label(l2: float | None) -> str:
    return "shipped" if l2 is None else f"residual l2={l2:g}"


Params = tuple[np.ndarray, np.ndarray, float, float, np.ndarray]


def _fit(x: np.ndarray, y: np.ndarray, base_logits: np.ndarray, l2: float | None) -> Params:
    """Slope, intercept and (unless `l2` is None) the correction, by L-BFGS on the mean log loss
    plus `l2 / 2 * |coef|^2`. The slope and intercept are all but free (a tiny pull keeps a
    one-class split finite)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0) + 1e-6
    z = (x - mean) / scale if l2 is not None else np.zeros((len(x), 0))
    n, p = z.shape
    pull = 1e-4

    def loss_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        slope, intercept, coef = theta[0], theta[1], theta[2:]
        margin = slope * base_logits + intercept + z @ coef
        loss = -np.mean(y * log_expit(margin) + (1 - y) * log_expit(-margin))
        residual = (expit(margin) - y) / n
        penalty = 0.5 * pull * ((slope - 1) ** 2 + intercept**2) + 0.5 * (l2 or 0.0) * float(coef @ coef)
        grad = np.concatenate(
            [
                [residual @ base_logits + pull * (slope - 1), residual.sum() + pull * intercept],
                z.T @ residual + (l2 or 0.0) * coef,
            ]
        )
        return float(loss + penalty), grad

    start = np.concatenate([[1.0, 0.0], np.zeros(p)])  # the shipped head
    theta = minimize(loss_and_grad, start, jac=True, method="L-BFGS-B", options={"maxiter": 500}).x
    coef = theta[2:] if l2 is not None else np.zeros(x.shape[1])
    return mean, scale, float(theta[0]), float(theta[1]), coef


def _log_loss(params: Params, x: np.ndarray, y: np.ndarray, base_logits: np.ndarray) -> float:
    mean, scale, slope, intercept, coef = params
    margin = slope * base_logits + intercept + ((x - mean) / scale) @ coef
    return float(-np.mean(y * log_expit(margin) + (1 - y) * log_expit(-margin)))
