"""Candidate heads over the design matrix (embedding + cheap features), trained on several labelled
sources at once, each source labelled with its own weak/strong pair.

A head's `score(x)` is in [0, 1] (higher: the prompt needs the stronger model more). The
matrix-factorisation head (`mf`, RouteLLM's idea) also predicts each known model's quality,
which is what routing among more than two tiers by value reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from switchyard.core.traces import Trace


@dataclass
class TrainingRows:
    x: np.ndarray  # design matrix, one row a prompt
    y: np.ndarray  # 1 where the source's strong model beat its weak model
    weight: np.ndarray  # sources balanced: each weighs as the square root of its size
    source: np.ndarray  # index into `sources`
    sources: list[str]
    models: list[str]  # every model with an outcome, for the mf head
    triples: np.ndarray  # (row, model index, quality) of every outcome
    pair: np.ndarray  # per row: (weak, strong) model index


def build_training_rows(
    traces_by_source: Mapping[str, Sequence[Trace]],
    pairs: Mapping[str, tuple[str, str]],
    design: Callable[[list[str]], np.ndarray],
) -> TrainingRows:
    """Rows of every source whose traces hold both models of its pair."""
    models = sorted({m for traces in traces_by_source.values() for t in traces for m in t.models})
    model_index = {m: i for i, m in enumerate(models)}
    prompts: list[str] = []
    y: list[float] = []
    weight: list[float] = []
    source: list[int] = []
    pair: list[tuple[int, int]] = []
    triples: list[tuple[int, int, float]] = []
    sources = list(traces_by_source)
    for k, name in enumerate(sources):
        weak, strong = pairs[name]
        usable = [t for t in traces_by_source[name] if weak in t.models and strong in t.models]
        for t in usable:
            row = len(prompts)
            prompts.append(t.prompt)
            y.append(float(t.models[strong].quality > t.models[weak].quality))
            weight.append(1 / np.sqrt(max(1, len(usable))))
            source.append(k)
            pair.append((model_index[weak], model_index[strong]))
            triples.extend((row, model_index[m], o.quality) for m, o in t.models.items())
    w = np.array(weight)
    return TrainingRows(
        x=design(prompts),
        y=np.array(y),
        weight=w / w.mean(),
        source=np.array(source),
        sources=sources,
        models=models,
        triples=np.array(triples, dtype=np.float64).reshape(-1, 3),
        pair=np.array(pair, dtype=int).reshape(-1, 2),
    )


class Head:
    name = ""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def fit(self, rows: TrainingRows) -> Head:
        raise NotImplementedError

    def score(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """scikit-learn's shape, so a `ComplexityClassifier` can hold any head."""
        positive = self.score(x)
        return np.column_stack([1 - positive, positive])


class _Standardised(Head):
    def _standardise_fit(self, x: np.ndarray) -> np.ndarray:
        self.mean_ = x.mean(axis=0)
        self.scale_ = x.std(axis=0) + 1e-6
        return (x - self.mean_) / self.scale_

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean_) / self.scale_


class LogRegHead(_Standardised):
    """A plain logistic regression (the shipped `logreg` recipe adds priors and calibration)."""

    name = "linear"

    def __init__(self, seed: int = 0, c: float = 0.05) -> None:
        super().__init__(seed)
        self.c = c

    def fit(self, rows: TrainingRows) -> LogRegHead:
        from sklearn.linear_model import LogisticRegression

        z = self._standardise_fit(rows.x)
        model = LogisticRegression(C=self.c, max_iter=3000, random_state=self.seed)
        model.fit(z, rows.y, sample_weight=rows.weight)
        self.coef_, self.intercept_ = model.coef_[0], float(model.intercept_[0])
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        return expit(self._standardise(x) @ self.coef_ + self.intercept_)


class MLPHead(_Standardised):
    """One hidden layer (ReLU), trained with scikit-learn, evaluated in numpy."""

    name = "mlp"

    def __init__(self, seed: int = 0, hidden: int = 128, alpha: float = 1.0) -> None:
        super().__init__(seed)
        self.hidden, self.alpha = hidden, alpha

    def fit(self, rows: TrainingRows) -> MLPHead:
        from sklearn.neural_network import MLPClassifier

        z = self._standardise_fit(rows.x)
        model = MLPClassifier(
            hidden_layer_sizes=(self.hidden,),
            alpha=self.alpha,
            early_stopping=True,
            max_iter=200,
            random_state=self.seed,
        )
        model.fit(z, rows.y, sample_weight=rows.weight)
        self.weights_ = [w.astype(np.float32) for w in model.coefs_]
        self.biases_ = [b.astype(np.float32) for b in model.intercepts_]
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum(self._standardise(x).astype(np.float32) @ self.weights_[0] + self.biases_[0], 0)
        return expit((h @ self.weights_[1] + self.biases_[1])[:, 0].astype(np.float64))


class KNNHead(Head):
    """The weighted strong-win rate of the nearest labelled prompts (cosine, on the embedding)."""

    name = "knn"

    def __init__(self, seed: int = 0, k: int = 64, embedding_dim: int = 384, smoothing: float = 4.0) -> None:
        super().__init__(seed)
        self.k, self.embedding_dim, self.smoothing = k, embedding_dim, smoothing

    def fit(self, rows: TrainingRows) -> KNNHead:
        self.keys_ = rows.x[:, : self.embedding_dim].astype(np.float32)
        self.y_, self.w_ = rows.y.astype(np.float32), rows.weight.astype(np.float32)
        self.prior_ = float(np.average(rows.y, weights=rows.weight))
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        similarity = x[:, : self.embedding_dim].astype(np.float32) @ self.keys_.T
        k = min(self.k, similarity.shape[1])
        nearest = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
        close = np.take_along_axis(similarity, nearest, axis=1)
        weights = np.exp((close - close.max(axis=1, keepdims=True)) * 20) * self.w_[nearest]
        weights /= weights.max(axis=1, keepdims=True)
        positives = (weights * self.y_[nearest]).sum(axis=1)
        return (positives + self.smoothing * self.prior_) / (weights.sum(axis=1) + self.smoothing)


class GBMHead(Head):
    name = "gbm"

    def __init__(self, seed: int = 0, max_iter: int = 300) -> None:
        super().__init__(seed)
        self.max_iter = max_iter

    def fit(self, rows: TrainingRows) -> GBMHead:
        from sklearn.ensemble import HistGradientBoostingClassifier

        self.model_ = HistGradientBoostingClassifier(
            max_iter=self.max_iter, learning_rate=0.05, max_leaf_nodes=15, l2_regularization=1.0, random_state=self.seed
        )
        self.model_.fit(rows.x, rows.y, sample_weight=rows.weight)
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(x)[:, 1]


class MFHead(_Standardised):
    """Matrix factorisation (RouteLLM's mf, pointwise): a model's quality on a prompt is
    sigmoid(<P x, v_model> + b_model), with P a learned projection of the design row and v a
    learned embedding per model. Trained on every model's outcome in the data, not only the
    pairs'; `score` is the predicted gain of `strong` over `weak` mapped into [0, 1]."""

    name = "mf"

    def __init__(
        self, seed: int = 0, dim: int = 64, epochs: int = 8, weight_decay: float = 1e-4, lr: float = 3e-3
    ) -> None:
        super().__init__(seed)
        self.dim, self.epochs, self.weight_decay, self.lr = dim, epochs, weight_decay, lr
        self.pair: tuple[int, int] | None = None

    def fit(self, rows: TrainingRows) -> MFHead:
        import torch

        torch.manual_seed(self.seed)
        z = torch.tensor(self._standardise_fit(rows.x), dtype=torch.float32)
        row = torch.tensor(rows.triples[:, 0], dtype=torch.long)
        model = torch.tensor(rows.triples[:, 1], dtype=torch.long)
        quality = torch.tensor(rows.triples[:, 2], dtype=torch.float32)
        weight = torch.tensor(rows.weight, dtype=torch.float32)[row]
        num_models = len(rows.models)
        projection = torch.nn.Linear(z.shape[1], self.dim)
        embedding = torch.nn.Embedding(num_models, self.dim)
        bias = torch.nn.Embedding(num_models, 1)
        torch.nn.init.normal_(embedding.weight, std=0.1)
        torch.nn.init.zeros_(bias.weight)
        parameters = [*projection.parameters(), *embedding.parameters(), *bias.parameters()]
        optimiser = torch.optim.AdamW(parameters, lr=self.lr, weight_decay=self.weight_decay)
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epochs):
            order = torch.randperm(len(row), generator=generator)
            for start in range(0, len(order), 1024):
                batch = order[start : start + 1024]
                logits = (projection(z[row[batch]]) * embedding(model[batch])).sum(1) + bias(model[batch])[:, 0]
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, quality[batch], weight=weight[batch]
                )
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        self.projection_ = projection.weight.detach().numpy().T.astype(np.float32)
        self.projection_bias_ = projection.bias.detach().numpy().astype(np.float32)
        self.model_vectors_ = embedding.weight.detach().numpy().astype(np.float32)
        self.model_bias_ = bias.weight.detach().numpy()[:, 0].astype(np.float32)
        self.models_ = list(rows.models)
        self.sources_ = list(rows.sources)
        # The score's default pair: the first source's (`classifier train`: the first --dataset).
        weak, strong = rows.pair[rows.source == 0][0]
        self.pair = (int(weak), int(strong))
        return self

    def quality(self, x: np.ndarray, models: Sequence[int] | None = None) -> np.ndarray:
        """Predicted quality, one column per model (all models when `models` is None)."""
        p = self._standardise(x).astype(np.float32) @ self.projection_ + self.projection_bias_
        chosen = np.arange(len(self.models_)) if models is None else np.asarray(models)
        return expit((p @ self.model_vectors_[chosen].T + self.model_bias_[chosen]).astype(np.float64))

    def score(self, x: np.ndarray, pair: tuple[int, int] | None = None) -> np.ndarray:
        weak, strong = pair or self.pair or (0, 1)
        q = self.quality(x, [weak, strong])
        return (q[:, 1] - q[:, 0] + 1) / 2


class FeatureHead(Head):
    """One column of the design matrix, as the share of training rows below it: `length` is log
    characters, the first cheap feature after the embedding (the length heuristic)."""

    name = "length"

    def __init__(self, seed: int = 0, column: int = 384) -> None:
        super().__init__(seed)
        self.column = column

    def fit(self, rows: TrainingRows) -> FeatureHead:
        self.sorted_ = np.sort(rows.x[:, self.column]).astype(np.float32)
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.sorted_, x[:, self.column], side="left") / len(self.sorted_)


HEADS: dict[str, type[Head]] = {cls.name: cls for cls in (LogRegHead, MLPHead, KNNHead, MFHead, GBMHead, FeatureHead)}


class RankEnsemble(Head):
    """The mean of its parts' scores, each mapped through its own distribution over the training
    rows (a fixed transform: a threshold means the same on any prompts). Named `a+b` (e.g. `mf+length`)."""

    def __init__(self, parts: Sequence[Head], seed: int = 0) -> None:
        super().__init__(seed)
        self.parts = list(parts)
        self.name = "+".join(part.name for part in parts)

    def fit(self, rows: TrainingRows) -> RankEnsemble:
        self.cdfs_ = [np.sort(part.fit(rows).score(rows.x)).astype(np.float32) for part in self.parts]
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        ranks = [
            np.searchsorted(cdf, part.score(x), side="left") / len(cdf)
            for part, cdf in zip(self.parts, self.cdfs_, strict=True)
        ]
        return np.mean(ranks, axis=0)


def quality_head(head: Head) -> MFHead | None:
    """The part of `head` that predicts each model's quality (an `mf` head, alone or in an ensemble)."""
    if isinstance(head, MFHead):
        return head
    base = getattr(head, "base", None)  # a re-tuned head's (classifier/residual_head.py)
    if isinstance(base, Head):
        return quality_head(base)
    parts = head.parts if isinstance(head, RankEnsemble) else []
    return next((part for part in parts if isinstance(part, MFHead)), None)


def make_head(name: str, seed: int = 0) -> Head:
    """A head by name: one of `HEADS`, or parts joined by `+` for their rank ensemble."""
    names = name.split("+")
    unknown = [n for n in names if n not in HEADS]
    if unknown:
        raise ValueError(f"unknown head {unknown[0]!r}; known: {', '.join(HEADS)} (or several joined by '+')")
    if len(names) == 1:
        return HEADS[name](seed=seed)
    return RankEnsemble([HEADS[n](seed=seed + i) for i, n in enumerate(names)], seed=seed)  # repeats differ
