"""From configuration and the thresholds file to a running `Cascade`.

Each rung's scorer and threshold: the thresholds file's `cascade.rungs.<model>` section when it
has one (written by `switchyard eval cascade`), else `cascade.scorer` / `cascade.threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.backends.registry import ModelRegistry
from switchyard.backends.resilience import ResilientExecutor
from switchyard.cascade.confidence import FeatureScorer, Scorer, scorer_from_dict
from switchyard.cascade.runtime import Cascade, CascadePolicy, Rung
from switchyard.cascade.thrash import ThrashGuard, ThrashPolicy
from switchyard.core.drift import DriftMonitor
from switchyard.core.metrics import Metrics
from switchyard.core.settings import CascadeSettings
from switchyard.core.thresholds import ThresholdsFile


@dataclass(frozen=True, slots=True)
class RungSpec:
    model: str
    scorer: Scorer
    threshold: float
    source: str  # "thresholds file" or "config"


def rung_specs(settings: CascadeSettings, thresholds_file: ThresholdsFile | None) -> list[RungSpec]:
    """Checked at start: a bad cascade section stops the proxy with a message (ValueError)."""
    cascade = thresholds_file.cascade if thresholds_file is not None else None
    fitted = cascade.rungs if cascade is not None else {}
    specs = []
    for name in settings.ladder:
        section = fitted.get(name)
        if section is None:
            specs.append(RungSpec(name, FeatureScorer(settings.scorer, settings.first_k), settings.threshold, "config"))
            continue
        try:
            scorer, threshold = scorer_from_dict(section.scorer), section.threshold
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"cascade.rungs.{name} in the thresholds file: {exc}") from exc
        specs.append(RungSpec(name, scorer, threshold, "thresholds file"))
    return specs


def build_cascade(
    settings: CascadeSettings,
    specs: list[RungSpec],
    registry: ModelRegistry,
    executor: ResilientExecutor,
    metrics: Metrics | None = None,
    drift: DriftMonitor | None = None,
) -> Cascade:
    policy = CascadePolicy(
        top_logprobs=settings.top_logprobs,
        stream_tokens=settings.stream_tokens,
        stream_budget_s=settings.stream_budget_ms / 1000,
        max_depth=settings.max_depth,
        hedge_margin=settings.hedge_margin,
    )
    guard = ThrashGuard(ThrashPolicy(**settings.thrash.model_dump()))
    rungs = [Rung(registry.get(spec.model), spec.scorer, spec.threshold) for spec in specs]
    return Cascade(rungs, policy, executor, guard, metrics, drift)
