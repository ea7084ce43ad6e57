"""Training the complexity classifier on the evals' train split; reporting on the test split."""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchyard.classifier.embedder import EMBEDDING_MODEL, Embedder, embedder_for
from switchyard.classifier.features import FEATURE_NAMES
from switchyard.classifier.model import ComplexityClassifier, design_matrix
from switchyard.classifier.subject_prior import SubjectPrior, subject_rates
from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.datasets import prompt_hash
from switchyard.evals.evaluate import Outcomes
from switchyard.evals.one_blas_thread import one_blas_thread

TARGETS = ("weak-wrong", "strong-wins")
REGULARISATION = (0.05, 0.3)
VALIDATION_SHARE = 3 / 16  # of the train split, by prompt hash; the test split is never used here


def target(outcomes: Outcomes, kind: str) -> np.ndarray:
    if kind == "weak-wrong":
        return (outcomes.q_weak < 0.5).astype(int)
    if kind == "strong-wins":
        return (outcomes.q_strong > outcomes.q_weak).astype(int)
    raise ValueError(f"unknown target {kind!r}; known: {', '.join(TARGETS)}")


def is_validation(trace: Trace) -> bool:
    return int(prompt_hash(trace.prompt)[-2:], 16) < 256 * VALIDATION_SHARE


def fit_head(x: np.ndarray, y: np.ndarray, c: float, seed: int):
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from switchyard.classifier.cluster_prior import ClusterPrior

    base = make_pipeline(
        ClusterPrior(seed=seed), StandardScaler(), LogisticRegression(C=c, max_iter=3000, random_state=seed)
    )
    return CalibratedClassifierCV(base, method="sigmoid", cv=3).fit(x, y)


class EmbeddingCache:
    """Embeddings of a list of texts, kept on disk by a hash of the texts."""

    def __init__(self, embedder: Embedder, directory: Path | None) -> None:
        self.embedder = embedder
        self.directory = directory

    def encode(self, texts: list[str], on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        name = getattr(self.embedder, "name", EMBEDDING_MODEL)
        prefix = [] if name == EMBEDDING_MODEL else [name]  # MiniLM keeps the key it always had
        key = hashlib.sha256("\0".join([*prefix, *texts]).encode()).hexdigest()[:24]
        path = self.directory / f"{key}.npy" if self.directory else None
        if path is not None and path.exists():
            if on_batch:
                on_batch(len(texts))
            return np.load(path)
        embeddings = self.embedder.encode(texts, on_batch=on_batch)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, embeddings)
        return embeddings


@dataclass
class TrainResult:
    classifier: ComplexityClassifier
    validation_apgr: dict[str, float]  # "target C=…" -> mean APGR over datasets


def pooled_outcomes(datasets: Mapping[str, Sequence[Trace]], pair_of: Mapping[str, tuple[str, str]]) -> Outcomes:
    """One `Outcomes` over several datasets, each row read with its own dataset's pair."""
    parts = [Outcomes.of(traces, *pair_of[name]) for name, traces in datasets.items() if traces]
    return Outcomes(
        [t for part in parts for t in part.traces],
        np.concatenate([part.q_weak for part in parts]),
        np.concatenate([part.q_strong for part in parts]),
        np.concatenate([part.c_weak for part in parts]),
        np.concatenate([part.c_strong for part in parts]),
    )


def _apgr(outcomes: Outcomes, scores: np.ndarray) -> float:
    return metrics.apgr(outcomes.curve(scores), outcomes.quality_weak, outcomes.quality_strong)


@one_blas_thread
def train(
    datasets: Mapping[str, Sequence[Trace]],
    weak: str,
    strong: str,
    encode: Callable[[list[str]], np.ndarray],
    *,
    seed: int = 0,
    data_sha256: str = "",
    embedding_model: str = EMBEDDING_MODEL,
    pairs: Mapping[str, tuple[str, str]] | None = None,
) -> TrainResult:
    """Fit on each dataset's train split; pick target and regularisation on a validation slice of it.

    `pairs`: a dataset's own (weak, strong) models, where it is not `weak` and `strong` (its
    labels then say whether its strong model beat its weak one)."""
    pair_of = {name: (pairs or {}).get(name, (weak, strong)) for name in datasets}
    datasets = with_pairs(datasets, pair_of, "train")
    rows = _TrainRows.of(datasets, pair_of, encode)
    scores_by_choice, choices = _choose(rows, datasets, pair_of, seed)
    best = max(scores_by_choice, key=lambda label: scores_by_choice[label])
    kind, c, use_prior = choices[best]
    head, subject_prior = _fit_chosen(rows, kind, c, use_prior, seed)
    metadata = {
        "target": kind,
        "regularisation_c": c,
        "subject_prior": use_prior,
        "embedding_model": embedding_model,
        "features": [
            "embedding[384]",
            *FEATURE_NAMES,
            *(["subject_prior"] if use_prior else []),
            "cluster_rate_nearest",
            "cluster_rate_weighted",
        ],
        "weak_model": weak,
        "strong_model": strong,
        "data": {"datasets": sorted(datasets), "sha256": data_sha256, "num_train": len(rows.traces)},
        **({"pairs": {name: list(pair) for name, pair in pair_of.items()}} if pairs else {}),
        "validation_apgr": scores_by_choice,
        "seed": seed,
        "libraries": _library_versions(),
    }
    # scores with the embedder it was trained on, as it will once saved and loaded again
    embedder = embedder_for(embedding_model)
    return TrainResult(
        ComplexityClassifier(head=head, metadata=metadata, subject_prior=subject_prior, embedder=embedder),
        scores_by_choice,
    )


def with_pairs(
    datasets: Mapping[str, Sequence[Trace]], pair_of: Mapping[str, tuple[str, str]], split_name: str
) -> dict[str, list[Trace]]:
    """Each dataset's `split_name` split, only the traces with an outcome for both models of its pair."""
    return {
        name: [t for t in traces if t.split == split_name and all(m in t.models for m in pair_of[name])]
        for name, traces in datasets.items()
    }


@dataclass
class _TrainRows:
    """The pooled train split of several datasets, row by row: what choosing and fitting read."""

    traces: list[Trace]
    dataset_of: np.ndarray  # each row's dataset
    embeddings: np.ndarray
    x: np.ndarray  # the design matrix
    is_val: np.ndarray  # the validation slice; the other rows fit
    outcomes: Outcomes
    subject_names: list[str]
    subjects: np.ndarray  # each row's index into subject_names

    @classmethod
    def of(cls, datasets: Mapping[str, Sequence[Trace]], pair_of: Mapping[str, tuple[str, str]], encode) -> _TrainRows:
        traces = [t for ts in datasets.values() for t in ts]
        embeddings = encode([t.prompt for t in traces])
        subject_names = sorted({t.category for t in traces})
        subject_index = {name: i for i, name in enumerate(subject_names)}
        return cls(
            traces=traces,
            dataset_of=np.array([name for name, ts in datasets.items() for t in ts]),
            embeddings=embeddings,
            x=design_matrix(embeddings, [t.prompt for t in traces]),
            is_val=np.array([is_validation(t) for t in traces]),
            outcomes=pooled_outcomes(datasets, pair_of),
            subject_names=subject_names,
            subjects=np.array([subject_index[t.category] for t in traces]),
        )


def _choose(
    rows: _TrainRows, datasets: Mapping[str, Sequence[Trace]], pair_of: Mapping[str, tuple[str, str]], seed: int
) -> tuple[dict[str, float], dict[str, tuple[str, float, bool]]]:
    """Every (target, C, subject prior or not) fitted on the fitting rows: its mean validation APGR
    over the datasets, and what each label stands for."""
    fit_rows, is_val = ~rows.is_val, rows.is_val
    embeddings, subjects, subject_names = rows.embeddings, rows.subjects, rows.subject_names
    # The subject prior for choosing on validation: out-of-fold on the fitting rows, and from a
    # classifier fitted on those rows for the validation rows.
    fit_oof = SubjectPrior(subject_names, seed=seed).out_of_fold(embeddings[fit_rows], subjects[fit_rows])
    val_probabilities = (
        SubjectPrior(subject_names, seed=seed)
        .fit_classifier(embeddings[fit_rows], subjects[fit_rows])
        .probabilities(embeddings[is_val])
    )
    scores_by_choice: dict[str, float] = {}
    choices: dict[str, tuple[str, float, bool]] = {}
    for kind in TARGETS:
        y = target(rows.outcomes, kind)
        prior = np.zeros(len(rows.traces))
        prior[fit_rows] = fit_oof.prior(y[fit_rows])
        prior[is_val] = val_probabilities @ subject_rates(subjects[fit_rows], y[fit_rows], len(subject_names), 10.0)
        for use_prior in (False, True):
            xx = np.column_stack([rows.x, prior]) if use_prior else rows.x
            for c in REGULARISATION:
                head = fit_head(xx[fit_rows], y[fit_rows], c, seed)
                label = f"{kind} C={c}" + (" +subject-prior" if use_prior else "")
                scores_by_choice[label] = _validation_apgr(rows, head, xx, datasets, pair_of)
                choices[label] = (kind, c, use_prior)
    return scores_by_choice, choices


def _validation_apgr(rows: _TrainRows, head, xx: np.ndarray, datasets, pair_of) -> float:
    """`head`'s APGR on each dataset's validation rows (those with at least 10), averaged."""
    per_dataset = []
    for name in datasets:
        chosen = np.flatnonzero(rows.is_val & (rows.dataset_of == name))
        if len(chosen) < 10:
            continue
        val = Outcomes.of([rows.traces[i] for i in chosen], *pair_of[name])
        per_dataset.append(_apgr(val, head.predict_proba(xx[chosen])[:, 1]))
    return float(np.mean(per_dataset))


def _fit_chosen(rows: _TrainRows, kind: str, c: float, use_prior: bool, seed: int):
    """The chosen head fitted on the whole train split, and its subject prior (None without one)."""
    y = target(rows.outcomes, kind)
    x = rows.x
    subject_prior = None
    if use_prior:
        subject_prior = SubjectPrior(rows.subject_names, seed=seed)
        oof_prior = subject_prior.out_of_fold(rows.embeddings, rows.subjects).prior(y)
        subject_prior.fit_classifier(rows.embeddings, rows.subjects).fit_rates(rows.subjects, y)
        x = np.column_stack([x, oof_prior])
    return fit_head(x, y, c, seed), subject_prior


@one_blas_thread
def train_head(
    datasets: Mapping[str, Sequence[Trace]],
    pairs: Mapping[str, tuple[str, str]],
    encode: Callable[[list[str]], np.ndarray],
    head_name: str,
    *,
    seed: int = 0,
    data_sha256: str = "",
    embedding_model: str = EMBEDDING_MODEL,
) -> TrainResult:
    """Fit a head from `classifier.heads` (e.g. `mf+length`) on every dataset's train split, each
    dataset labelled with its own pair; its validation APGR (fitted without the validation slice)
    is reported, not used to choose."""
    from switchyard.classifier.heads import build_training_rows, make_head

    train_by_source = with_pairs(datasets, pairs, "train")

    def design(prompts: list[str]) -> np.ndarray:
        return design_matrix(encode(prompts), prompts)

    fit_part = {name: [t for t in traces if not is_validation(t)] for name, traces in train_by_source.items()}
    head = make_head(head_name, seed).fit(build_training_rows(fit_part, pairs, design))
    per_dataset = {}
    for name, traces in train_by_source.items():
        held = [t for t in traces if is_validation(t)]
        if len(held) >= 10:
            val = Outcomes.of(held, *pairs[name])
            per_dataset[name] = _apgr(val, head.score(design([t.prompt for t in val.traces])))
    label = f"{head_name} (mean over {', '.join(per_dataset)})"
    validation = {label: float(np.mean(list(per_dataset.values())))}
    rows = build_training_rows(train_by_source, pairs, design)
    head = make_head(head_name, seed).fit(rows)

    default_pair = pairs[next(iter(datasets))]
    metadata = {
        "head": head_name,
        "target": "strong-wins",
        "embedding_model": embedding_model,
        "features": ["embedding[384]", *FEATURE_NAMES],
        "weak_model": default_pair[0],
        "strong_model": default_pair[1],
        "models": list(rows.models),
        "data": {"datasets": sorted(datasets), "sha256": data_sha256, "num_train": len(rows.y)},
        "pairs": {name: list(pair) for name, pair in pairs.items()},
        "validation_apgr": validation,
        "validation_apgr_per_dataset": per_dataset,
        "seed": seed,
        "libraries": _library_versions(),
    }
    return TrainResult(
        ComplexityClassifier(head=head, metadata=metadata, embedder=embedder_for(embedding_model)), validation
    )


def _library_versions() -> dict[str, str]:
    """What an artifact was trained with, for its metadata."""
    import joblib
    import sklearn
    import torch

    return {
        "python": platform.python_version(),
        "scikit-learn": sklearn.__version__,
        "joblib": joblib.__version__,
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
