"""A supervised stand-in for the subject: P(subject | prompt) times each subject's rate of prompts
that needed the strong model.

The train split knows each prompt's subject (its trace category: an MMLU subject, or "gsm8k"). A
multinomial logistic regression learns to read the subject from the embedding; the feature is the
expected positive rate under its predicted distribution, so an unseen prompt gets the prior of
the subject it looks like. No label of a prompt is used to compute its own feature: on training
rows the probabilities come out-of-fold, and so do the rates.
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold


def subject_rates(subjects: np.ndarray, y: np.ndarray, num_subjects: int, smoothing: float) -> np.ndarray:
    overall = float(y.mean()) if len(y) else 0.5
    counts = np.bincount(subjects, minlength=num_subjects)
    positives = np.bincount(subjects, weights=y, minlength=num_subjects)
    return (positives + smoothing * overall) / (counts + smoothing)


class SubjectPrior:
    def __init__(self, subject_names: list[str], c: float = 10.0, smoothing: float = 10.0, seed: int = 0) -> None:
        self.subject_names = list(subject_names)
        self.c = c
        self.smoothing = smoothing
        self.seed = seed
        self.classifier_: LogisticRegression | None = None
        self.rates_: np.ndarray | None = None

    def _classifier(self, embeddings: np.ndarray, subjects: np.ndarray) -> LogisticRegression:
        return LogisticRegression(C=self.c, max_iter=300, random_state=self.seed).fit(embeddings, subjects)

    def _probabilities(self, classifier: LogisticRegression, embeddings: np.ndarray) -> np.ndarray:
        """Columns for every subject, in `subject_names` order (a fold may lack some). The multinomial
        softmax in numpy: `predict_proba`'s numbers without its checks, which cost more per call."""
        out = np.zeros((len(embeddings), len(self.subject_names)))
        logits = np.asarray(embeddings, dtype=np.float64) @ classifier.coef_.T + classifier.intercept_
        out[:, classifier.classes_] = softmax(logits, axis=1)
        return out

    def fit_classifier(self, embeddings: np.ndarray, subjects: np.ndarray) -> SubjectPrior:
        self.classifier_ = self._classifier(embeddings, subjects)
        return self

    def fit_rates(self, subjects: np.ndarray, y: np.ndarray) -> SubjectPrior:
        self.rates_ = subject_rates(subjects, np.asarray(y, float), len(self.subject_names), self.smoothing)
        return self

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        assert self.classifier_ is not None, "fit_classifier first"
        return self._probabilities(self.classifier_, embeddings)

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        assert self.rates_ is not None, "fit_rates first"
        return self.probabilities(embeddings) @ self.rates_

    def out_of_fold(self, embeddings: np.ndarray, subjects: np.ndarray, folds: int = 5) -> OutOfFold:
        """Out-of-fold subject probabilities, reusable for any label vector (see `OutOfFold.prior`)."""
        probabilities = np.zeros((len(embeddings), len(self.subject_names)))
        fold_of = np.zeros(len(embeddings), dtype=int)
        splitter = KFold(n_splits=folds, shuffle=True, random_state=self.seed)
        for k, (train_rows, held_rows) in enumerate(splitter.split(embeddings)):
            classifier = self._classifier(embeddings[train_rows], subjects[train_rows])
            probabilities[held_rows] = self._probabilities(classifier, embeddings[held_rows])
            fold_of[held_rows] = k
        return OutOfFold(probabilities, fold_of, subjects, len(self.subject_names), self.smoothing)


class OutOfFold:
    def __init__(self, probabilities, fold_of, subjects, num_subjects: int, smoothing: float) -> None:
        self.probabilities, self.fold_of, self.subjects = probabilities, fold_of, subjects
        self.num_subjects, self.smoothing = num_subjects, smoothing

    def prior(self, y: np.ndarray) -> np.ndarray:
        """Each row's feature, with rates from the other folds' labels only."""
        y = np.asarray(y, float)
        out = np.zeros(len(y))
        for k in np.unique(self.fold_of):
            held, rest = self.fold_of == k, self.fold_of != k
            rates = subject_rates(self.subjects[rest], y[rest], self.num_subjects, self.smoothing)
            out[held] = self.probabilities[held] @ rates
        return out
