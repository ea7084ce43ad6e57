"""How sure the cheap model was of its answer, from its token log-probabilities.

Features (`FEATURES`, in this order), over the whole answer and over its first `first_k` tokens:
mean, minimum and 10th percentile of the chosen tokens' logprobs; mean entropy of the top-k
distribution; mean margin between the two most likely tokens (in probability); plus the sum of
logprobs and the answer length (log1p tokens). Plain means are length-biased (Gupta et al. 2024,
"Language Model Cascades: Token-Level Uncertainty and Beyond"), which is why the quantiles and the
first-k versions are there, and why a learned scorer may weigh them.

When an answer carries no `top_logprobs` (a trace may hold only the chosen token's logprob, e.g.
the letter of a multiple-choice answer), entropy and margin fall back to the two-way split between
the chosen token (p) and everything else (1 - p).

Scorers map an answer to a confidence (higher: more sure) that a threshold compares:

- `FeatureScorer("p10_logprob")`: one feature, signed so that higher is more confident;
- `LogisticScorer`: logistic regression over the standardised features, fitted offline
  (`switchyard eval cascade`), giving P(the cheap answer is acceptable). It is stored as plain
  numbers in the thresholds file, not as a pickle.

`None` means "cannot judge" (no logprobs at all); the cascade escalates then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from switchyard.core.thresholds import CONFIDENCE_FEATURES

DEFAULT_FIRST_K = 16

FEATURES = CONFIDENCE_FEATURES  # name -> sign that makes "higher = more confident"
FEATURE_NAMES = tuple(FEATURES)


@dataclass(frozen=True, slots=True)
class TokenEvidence:
    """What an answer says about itself: per token, the chosen logprob and its alternatives."""

    logprobs: list[float]
    top: list[list[float]] | None = None  # per token, the alternatives' logprobs (any order)

    def __len__(self) -> int:
        return len(self.logprobs)


def evidence_from_trace(
    token_logprobs: Sequence[float] | None, top_logprobs: Sequence[Any] | None
) -> TokenEvidence | None:
    """From the trace format (or OpenAI's chat logprobs flattened the same way)."""
    if not token_logprobs:
        return None
    top = None
    if top_logprobs and len(top_logprobs) == len(token_logprobs):
        top = [_alternatives(entry) for entry in top_logprobs]
    return TokenEvidence([float(x) for x in token_logprobs], top)


def _alternatives(entry: Any) -> list[float]:
    if isinstance(entry, dict):  # completions style {token: logprob}
        return [float(v) for v in entry.values()]
    return [float(alt["logprob"]) for alt in entry or ()]


def _entropy_and_margin(chosen: float, alternatives: list[float] | None) -> tuple[float, float]:
    p = math.exp(min(chosen, 0.0))
    if alternatives:
        probs = [math.exp(min(a, 0.0)) for a in alternatives]
        if not any(abs(a - chosen) < 1e-9 for a in alternatives):  # a sampled token outside the top-k
            probs.append(p)
        probs = sorted((x for x in probs if x > 0), reverse=True)
        total = sum(probs)
        normalised = [x / total for x in probs]
        entropy = -sum(x * math.log(x) for x in normalised if x > 0)
        margin = probs[0] - (probs[1] if len(probs) > 1 else max(0.0, 1.0 - probs[0]))
        return entropy, margin
    rest = max(0.0, 1.0 - p)
    entropy = -sum(x * math.log(x) for x in (p, rest) if x > 0)
    return entropy, p - rest


def features(evidence: TokenEvidence, first_k: int = DEFAULT_FIRST_K) -> np.ndarray:
    """The feature vector (order of `FEATURE_NAMES`) of one answer with at least one token."""
    lp = np.asarray(evidence.logprobs, dtype=float)
    ent_margin = np.array(
        [_entropy_and_margin(c, evidence.top[i] if evidence.top else None) for i, c in enumerate(evidence.logprobs)]
    )
    k = max(1, min(first_k, len(lp)))
    head, head_em = lp[:k], ent_margin[:k]
    return np.array(
        [
            lp.mean(),
            lp.min(),
            np.percentile(lp, 10),
            ent_margin[:, 0].mean(),
            ent_margin[:, 1].mean(),
            head.mean(),
            head.min(),
            np.percentile(head, 10),
            head_em[:, 0].mean(),
            head_em[:, 1].mean(),
            lp.sum(),
            math.log1p(len(lp)),
        ]
    )


def feature_matrix(evidence: Sequence[TokenEvidence | None], first_k: int = DEFAULT_FIRST_K) -> np.ndarray:
    """Rows of features; rows for answers without evidence are NaN."""
    out = np.full((len(evidence), len(FEATURE_NAMES)), np.nan)
    for i, item in enumerate(evidence):
        if item is not None and len(item):
            out[i] = features(item, first_k)
    return out


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def first_k(self) -> int: ...

    def score_matrix(self, matrix: np.ndarray) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


def score(scorer: Scorer, evidence: TokenEvidence | None) -> float | None:
    if evidence is None or not len(evidence):
        return None
    return float(scorer.score_matrix(features(evidence, scorer.first_k)[None, :])[0])


@dataclass(frozen=True, slots=True)
class FeatureScorer:
    feature: str
    first_k: int = DEFAULT_FIRST_K

    def __post_init__(self) -> None:
        if self.feature not in FEATURES:
            raise ValueError(f"unknown confidence feature {self.feature!r}; known: {', '.join(FEATURE_NAMES)}")

    @property
    def name(self) -> str:
        return self.feature

    def score_matrix(self, matrix: np.ndarray) -> np.ndarray:
        return FEATURES[self.feature] * matrix[:, FEATURE_NAMES.index(self.feature)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "feature", "feature": self.feature, "first_k": self.first_k}


@dataclass(frozen=True, slots=True)
class LogisticScorer:
    """P(acceptable) = sigmoid(intercept + coef . (x - mean) / scale)."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    first_k: int = DEFAULT_FIRST_K
    name: str = "learned"

    def score_matrix(self, matrix: np.ndarray) -> np.ndarray:
        z = (matrix - np.asarray(self.mean)) / np.asarray(self.scale)
        logits = self.intercept + z @ np.asarray(self.coef)
        return 1.0 / (1.0 + np.exp(-np.clip(logits, -60, 60)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "logistic",
            "features": list(FEATURE_NAMES),
            "mean": [round(x, 8) for x in self.mean],
            "scale": [round(x, 8) for x in self.scale],
            "coef": [round(x, 8) for x in self.coef],
            "intercept": round(self.intercept, 8),
            "first_k": self.first_k,
        }


def fit_logistic(matrix: np.ndarray, acceptable: np.ndarray, first_k: int = DEFAULT_FIRST_K) -> LogisticScorer:
    """Fit on rows with evidence; `acceptable` is 1 where the cheap answer was good enough."""
    from sklearn.linear_model import LogisticRegression

    rows = ~np.isnan(matrix).any(axis=1)
    x, y = matrix[rows], np.asarray(acceptable)[rows].astype(int)
    if len(set(y.tolist())) < 2:
        raise ValueError("the learned scorer needs both acceptable and unacceptable cheap answers in the train split")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    model = LogisticRegression(C=1.0, max_iter=2000)
    model.fit((x - mean) / scale, y)
    return LogisticScorer(
        tuple(mean.tolist()),
        tuple(scale.tolist()),
        tuple(model.coef_[0].tolist()),
        float(model.intercept_[0]),
        first_k,
    )


def scorer_from_dict(raw: dict[str, Any]) -> Scorer:
    """The inverse of `to_dict`; a ValueError names what is wrong."""
    kind = raw.get("kind")
    first_k = int(raw.get("first_k", DEFAULT_FIRST_K))
    if kind == "feature":
        return FeatureScorer(str(raw.get("feature")), first_k)
    if kind == "logistic":
        names = list(raw.get("features") or [])
        if names != list(FEATURE_NAMES):
            raise ValueError(
                f"the learned scorer was fitted on features {names}; this Switchyard computes {list(FEATURE_NAMES)}. "
                "Re-run `switchyard eval cascade`."
            )
        vectors = {key: tuple(float(v) for v in raw.get(key) or ()) for key in ("mean", "scale", "coef")}
        if any(len(v) != len(FEATURE_NAMES) for v in vectors.values()):
            raise ValueError("the learned scorer's mean, scale and coef must each have one number per feature")
        return LogisticScorer(vectors["mean"], vectors["scale"], vectors["coef"], float(raw["intercept"]), first_k)
    raise ValueError(f"scorer kind must be 'feature' or 'logistic', not {kind!r}")
