"""The classifier head in plain numpy: the same numbers as scikit-learn's `predict_proba`, without
its per-call checks (~2.5 ms a call for three calibrated folds, whatever the batch size).

It reads the fitted calibrated pipeline (`CalibratedClassifierCV` over `ClusterPrior` →
`StandardScaler` → `LogisticRegression`, sigmoid calibration) once; `compile_head` returns None
for any other shape, and the caller keeps scikit-learn's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import expit

if TYPE_CHECKING:
    from switchyard.classifier.cluster_prior import ClusterPrior


@dataclass(frozen=True)
class _Fold:
    cluster_prior: ClusterPrior  # its _features(centres, rates)
    centres: np.ndarray
    rates: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    a: float
    b: float


class FastHead:
    def __init__(self, folds: list[_Fold]) -> None:
        self.folds = folds

    def predict_positive(self, x: np.ndarray) -> np.ndarray:
        """P(class 1) for rows of the design matrix."""
        x = np.asarray(x, dtype=np.float64)
        total = np.zeros(len(x))
        for fold in self.folds:
            prior = fold.cluster_prior._features(x[:, : fold.cluster_prior.embedding_dim], fold.centres, fold.rates)
            z = (np.hstack([x, prior]) - fold.mean) / fold.scale
            decision = z @ fold.coef + fold.intercept
            total += expit(-(fold.a * decision + fold.b))
        return total / len(self.folds)


def compile_head(head) -> FastHead | None:
    from sklearn.calibration import CalibratedClassifierCV

    from switchyard.classifier.cluster_prior import ClusterPrior

    if not isinstance(head, CalibratedClassifierCV) or list(head.classes_) != [0, 1] or head.method != "sigmoid":
        return None
    folds = []
    for calibrated in head.calibrated_classifiers_:
        steps = [step for _, step in calibrated.estimator.steps]
        if len(steps) != 3 or not isinstance(steps[0], ClusterPrior) or len(calibrated.calibrators) != 1:
            return None
        prior, scaler, logistic = steps
        scale = scaler.scale_ if scaler.scale_ is not None else np.ones_like(scaler.mean_)
        calibrator = calibrated.calibrators[0]
        folds.append(
            _Fold(
                prior,
                prior.centres_,
                prior.rates_,
                scaler.mean_,
                scale,
                logistic.coef_[0],
                float(logistic.intercept_[0]),
                float(calibrator.a_),
                float(calibrator.b_),
            )
        )
    return FastHead(folds)
