"""Classifier artifacts side by side (`switchyard eval route --artifacts all`): each set's prompts
that none of them was fitted on, chat sets first, and a paired bootstrap over those prompts for
the noise of every number and of each artifact's difference from the default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.datasets import CHAT_SETS, assign_splits
from switchyard.evals.evaluate import Outcomes

NUM_RESAMPLES = 1000
INTERVAL = 0.90
QUALITY_TARGET = 0.95  # of the strong model's quality, as the `balanced` quality mode
# Chat first: the default artifact is chosen on these, then checked on the others.
DEFAULT_SETS = (*CHAT_SETS, "mmlu", "gsm8k", "llmrouter")


def shipped_artifacts(root: Path, default: Path) -> list[Path]:
    """Every artifact folder under `root`, the default first, then by name."""
    found = sorted(p for p in root.iterdir() if (p / "metadata.json").is_file())
    return sorted(found, key=lambda p: p.resolve() != default.resolve())


def chat_first(names: Sequence[str]) -> list[str]:
    """The named chat sets first, each group in the order given."""
    return sorted(names, key=lambda name: name not in CHAT_SETS)


def held_out(traces: list[Trace], names: Sequence[str], metadatas: Sequence[Mapping]) -> tuple[list[Trace], str]:
    """The prompts none of the artifacts was fitted on, and how to say which they are. An artifact
    trained on a set saw its train split (and tuned on slices of it): only the test split is left."""
    seen = any(name in m.get("data", {}).get("datasets", []) for m in metadatas for name in names)
    if not seen:
        return list(traces), "all prompts"
    if not any(t.split == "test" for t in traces):
        assign_splits(traces)  # as `classifier train` splits a file without splits
    return [t for t in traces if t.split == "test"], "test split"


@dataclass(frozen=True, slots=True)
class ArtifactResult:
    """One artifact on one set's held-out prompts; intervals are (low, high) over resamples."""

    artifact: str
    apgr: float
    apgr_interval: tuple[float, float]
    delta: float  # APGR minus the reference artifact's, on the same prompts
    delta_interval: tuple[float, float]
    cpt50: float
    cpt80: float
    strong_share_at_target: float  # strong calls needed to reach QUALITY_TARGET of strong quality


@dataclass(frozen=True, slots=True)
class SetResult:
    dataset: str
    is_chat: bool
    weak: str
    strong: str
    num_prompts: int
    which_prompts: str
    artifacts: list[ArtifactResult]


def _apgr(outcomes: Outcomes, scores: np.ndarray) -> float:
    return metrics.apgr(outcomes.curve(scores), outcomes.quality_weak, outcomes.quality_strong)


def _interval(values: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - INTERVAL) / 2
    finite = values[np.isfinite(values)]
    if not len(finite):
        return float("nan"), float("nan")
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def compare(
    outcomes: Outcomes, scores: Mapping[str, np.ndarray], reference: str, seed: int = 0
) -> list[ArtifactResult]:
    """Each artifact's scores on `outcomes`, with APGR and its difference from `reference`'s
    resampled together (the same prompts drawn for every artifact), so a shared hard draw does
    not pass for a difference between artifacts."""
    n = len(outcomes.traces)
    draws = np.random.default_rng(seed).integers(0, n, size=(NUM_RESAMPLES, n))
    resampled = {name: np.empty(NUM_RESAMPLES) for name in scores}
    for i, rows in enumerate(draws):
        sample = Outcomes(
            [],
            outcomes.q_weak[rows],
            outcomes.q_strong[rows],
            outcomes.c_weak[rows],
            outcomes.c_strong[rows],
        )
        for name, values in scores.items():
            resampled[name][i] = _apgr(sample, values[rows])
    qw, qs = outcomes.quality_weak, outcomes.quality_strong
    results = []
    for name, values in scores.items():
        curve = outcomes.curve(values)
        results.append(
            ArtifactResult(
                artifact=name,
                apgr=_apgr(outcomes, values),
                apgr_interval=_interval(resampled[name]),
                delta=_apgr(outcomes, values) - _apgr(outcomes, scores[reference]),
                delta_interval=_interval(resampled[name] - resampled[reference]),
                cpt50=metrics.cpt(curve, 0.5, qw, qs),
                cpt80=metrics.cpt(curve, 0.8, qw, qs),
                strong_share_at_target=metrics.strong_share_at_quality(curve, QUALITY_TARGET * qs),
            )
        )
    return results


def best_on_chat(results: Sequence[SetResult]) -> tuple[str, float] | None:
    """The artifact with the highest APGR averaged over the chat sets (each set counts once)."""
    chat = [r for r in results if r.is_chat]
    if not chat:
        return None
    names = [a.artifact for a in chat[0].artifacts]
    means = {name: float(np.mean([a.apgr for r in chat for a in r.artifacts if a.artifact == name])) for name in names}
    best = max(names, key=lambda name: means[name])
    return best, means[best]
