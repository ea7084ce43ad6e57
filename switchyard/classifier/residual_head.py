"""A shipped head re-tuned on a company's own traffic (`switchyard eval retune`).

The score stays the shipped head's, its logit rescaled and shifted, plus a linear correction over
the standardised design row: `sigmoid(slope * logit(base(x)) + intercept + z(x) @ coef)`. With
`coef` zero it ranks prompts exactly as the shipped head does, which is where fitting starts and
what its L2 penalty pulls toward: a few hundred labelled rows add to what the public sets taught
the head instead of replacing it. Fitting lives in `switchyard.evals.retune_head`; this is only
what the proxy loads and scores with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import expit, logit

from switchyard.classifier.heads import Head

_EDGE = 1e-6  # the base score is clipped this far from 0 and 1 before its logit


class ResidualHead(Head):
    name = "residual"

    def __init__(
        self,
        base: Any,
        slope: float,
        intercept: float,
        mean: np.ndarray,
        scale: np.ndarray,
        coef: np.ndarray,
        seed: int = 0,
    ) -> None:
        super().__init__(seed)
        self.base = base  # the shipped head: a scikit-learn estimator or a `Head`
        self.slope, self.intercept = float(slope), float(intercept)
        self.mean_, self.scale_, self.coef_ = mean, scale, coef
        self._fast: Any = None

    def base_logit(self, x: np.ndarray) -> np.ndarray:
        if self._fast is None:
            from switchyard.classifier.fast_head import compile_head

            self._fast = compile_head(self.base) or False
        positive = self._fast.predict_positive(x) if self._fast else self.base.predict_proba(x)[:, 1]
        return logit(np.clip(positive, _EDGE, 1 - _EDGE))

    def score(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        correction = ((x - self.mean_) / self.scale_) @ self.coef_
        return expit(self.slope * self.base_logit(x) + self.intercept + correction)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fast": None}  # compiled again after loading
