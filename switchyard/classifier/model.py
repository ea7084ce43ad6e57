"""The complexity classifier: a sentence embedding plus cheap features, into a calibrated
scikit-learn head. Its score, in [0, 1], is the probability that the prompt needs the stronger
model. Saved as a versioned artifact: `model.joblib` and `metadata.json` side by side."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from switchyard.classifier.embedder import EMBEDDERS, EMBEDDING_MODEL, Embedder, embedder_for
from switchyard.classifier.features import feature_matrix
from switchyard.core.import_lock import IMPORT_LOCK

ARTIFACT_VERSION = 1  # a calibrated scikit-learn head (with its priors)
HEADS_ARTIFACT_VERSION = 2  # a head from classifier/heads.py: older readers refuse it by its version
READABLE_VERSIONS = (ARTIFACT_VERSION, HEADS_ARTIFACT_VERSION)
ARTIFACTS = Path(__file__).parent / "artifacts"
MINILM_ARTIFACT = ARTIFACTS / "minilm-logreg"
STATIC_ARTIFACT = ARTIFACTS / "static-logreg"
# Trained on four sources (MMLU, GSM8K, LLMRouter, arena-bench-v1): a matrix-factorisation head
# ranked together with prompt length, on the static embedding (bench/RESULTS.md, "Routing on many
# sources"). The static embedding is ~200x cheaper per prompt than MiniLM, which is what keeps the
# decision under 10 ms at 32 concurrent prompts.
MULTI_SOURCE_ARTIFACT = ARTIFACTS / "static-mf-length"
# The default is chosen on chat first (arena-bench-v1, vicuna80), then checked for regressions on
# the other sets: `switchyard eval route --artifacts all`, docs/routing.md.
DEFAULT_ARTIFACT = STATIC_ARTIFACT
# Routing by value needs a head that predicts each model's quality; of the shipped ones only this.
BY_VALUE_ARTIFACT = MULTI_SOURCE_ARTIFACT


def default_artifact(by_value: bool) -> Path:
    """The shipped artifact used when the config names none."""
    return BY_VALUE_ARTIFACT if by_value else DEFAULT_ARTIFACT


class ArtifactError(ValueError):
    """A classifier artifact that cannot be used; the message says why."""


def design_matrix(embeddings: np.ndarray, texts: list[str], subject_prior=None) -> np.ndarray:
    """Embedding, cheap features, and the subject prior's column when the artifact has one."""
    return design_matrix_of(embeddings, feature_matrix(texts), subject_prior)


def design_matrix_of(embeddings: np.ndarray, features: np.ndarray, subject_prior=None) -> np.ndarray:
    """`design_matrix` from features already computed (a learning row keeps them, not its text)."""
    columns = [embeddings, features]
    if subject_prior is not None:
        columns.append(subject_prior.predict(embeddings)[:, None])
    return np.hstack(columns)


@dataclass
class ComplexityClassifier:
    head: Any  # a fitted scikit-learn estimator with predict_proba
    metadata: dict[str, Any]
    embedder: Embedder = field(default_factory=Embedder)
    subject_prior: Any = None  # classifier.subject_prior.SubjectPrior, when training chose it

    fast_head: Any = None  # classifier.fast_head.FastHead: the head in numpy, when it has the usual shape

    def __post_init__(self) -> None:
        from switchyard.classifier.fast_head import compile_head

        self.fast_head = compile_head(self.head)

    def score_embedded(self, embeddings: np.ndarray, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        return self.score_design(design_matrix(embeddings, texts, self.subject_prior))

    def score_design(self, x: np.ndarray) -> np.ndarray:
        """Scores of rows of the design matrix (`design_matrix`)."""
        if self.fast_head is not None:
            return self.fast_head.predict_positive(x)
        return self.head.predict_proba(x)[:, 1]

    def score(self, texts: list[str]) -> np.ndarray:
        """Blocking (an embedding forward pass): call it off the event loop."""
        return self.score_embedded(self.embedder.encode(texts), texts)

    def score_with_quality(self, texts: list[str], models: Sequence[str]) -> np.ndarray:
        """One row a prompt: the score, then each of `models`' predicted quality (routing by value).
        Blocking, like `score`."""
        from switchyard.classifier.heads import quality_head

        head = quality_head(self.head)
        if head is None:
            raise ArtifactError(f"the {self.metadata.get('head')!r} head predicts no model's quality")
        if not texts:
            return np.zeros((0, 1 + len(models)))
        embeddings = self.embedder.encode(texts)
        x = design_matrix(embeddings, texts, self.subject_prior)
        quality = head.quality(x, [head.models_.index(m) for m in models])
        return np.column_stack([self.score_embedded(embeddings, texts), quality])

    @staticmethod
    def check_quality_models(directory: str | Path, models: Sequence[str]) -> None:
        """That the artifact predicts the quality of each of `models` (cheap: its metadata only)."""
        metadata = ComplexityClassifier.read_metadata(directory)
        if "mf" not in str(metadata.get("head", "")).split("+"):
            raise ArtifactError(
                f"routing by value needs a head that predicts each model's quality (`mf`); {directory} "
                f"holds {metadata.get('head', 'a logistic regression')!r}"
            )
        known = metadata.get("models", [])
        unknown = [m for m in models if m not in known]
        if unknown:
            raise ArtifactError(
                f"{directory} predicts no quality for {', '.join(map(repr, unknown))}; it knows: {', '.join(known)}"
            )

    def save(self, directory: str | Path) -> None:
        import joblib

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = self.head if self.subject_prior is None else {"head": self.head, "subject_prior": self.subject_prior}
        from switchyard.classifier.heads import Head

        joblib.dump(payload, directory / "model.joblib", compress=3)
        version = HEADS_ARTIFACT_VERSION if isinstance(self.head, Head) else ARTIFACT_VERSION
        metadata = _finite({"version": version, **self.metadata})
        (directory / "metadata.json").write_text(json.dumps(metadata, indent=2, allow_nan=False))

    @staticmethod
    def read_metadata(directory: str | Path = DEFAULT_ARTIFACT) -> dict[str, Any]:
        """The artifact's metadata, checked for a version this code reads (cheap: no model loads)."""
        directory = Path(directory)
        try:
            metadata = json.loads((directory / "metadata.json").read_text())
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"no readable classifier artifact in {directory}: {exc}") from exc
        if metadata.get("embedding_model", EMBEDDING_MODEL) not in EMBEDDERS:
            raise ArtifactError(
                f"{directory} uses embedding model {metadata.get('embedding_model')!r}; known: {', '.join(EMBEDDERS)}"
            )
        if metadata.get("version") not in READABLE_VERSIONS:
            raise ArtifactError(
                f"{directory} holds classifier artifact version {metadata.get('version')!r}; this Switchyard "
                f"reads versions {', '.join(map(str, READABLE_VERSIONS))}. Re-run `switchyard classifier train`."
            )
        return metadata

    @classmethod
    def load(
        cls, directory: str | Path = DEFAULT_ARTIFACT, embedder=None, num_threads: int | None = None
    ) -> ComplexityClassifier:
        """`embedder`: default, the one the artifact was trained with (its metadata says which)."""
        with IMPORT_LOCK:  # unpickling imports scikit-learn's modules (core/import_lock.py)
            return cls._load(Path(directory), embedder, num_threads)

    @classmethod
    def _load(cls, directory: Path, embedder, num_threads: int | None) -> ComplexityClassifier:
        import joblib
        import sklearn

        metadata = cls.read_metadata(directory)
        trained_with = metadata.get("libraries", {}).get("scikit-learn", "")
        if trained_with.split(".")[:2] != sklearn.__version__.split(".")[:2]:
            raise ArtifactError(
                f"{directory} was trained with scikit-learn {trained_with}; this is {sklearn.__version__}. "
                "Re-run `switchyard classifier train`."
            )
        name = metadata.get("embedding_model", EMBEDDING_MODEL)
        if embedder is None:
            try:
                embedder = embedder_for(name, num_threads)
            except ValueError as exc:
                raise ArtifactError(f"{directory}: {exc}") from exc
        elif embedder.name != name:
            raise ArtifactError(f"{directory} was trained on {name} embeddings, not {embedder.name}")
        payload = joblib.load(directory / "model.joblib")
        if isinstance(payload, dict):  # head plus subject prior
            return cls(payload["head"], metadata, embedder, payload["subject_prior"])
        return cls(head=payload, metadata=metadata, embedder=embedder)


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float as None: JSON has no NaN (a metric of too few
    held-out prompts is undefined, not a number)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
