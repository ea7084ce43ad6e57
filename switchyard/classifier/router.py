"""The classifier as an evals router (`switchyard eval route --router classifier`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from switchyard.classifier.model import DEFAULT_ARTIFACT, ComplexityClassifier
from switchyard.core.routers import Router
from switchyard.core.traces import Trace


class ClassifierRouter(Router):
    name = "classifier"

    def __init__(self, artifact: str | Path = DEFAULT_ARTIFACT, classifier: ComplexityClassifier | None = None) -> None:
        self.classifier = classifier or ComplexityClassifier.load(artifact)

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return self.classifier.score([t.prompt for t in traces])
