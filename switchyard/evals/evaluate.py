"""Score routers on a trace set and summarise each on the test split."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from switchyard.core.traces import Trace
from switchyard.evals import metrics
from switchyard.evals.routers import FIXED_ROUTERS, Router


class EvalError(ValueError):
    """The data cannot answer the question asked (missing models, empty split, …)."""


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Per-prompt quality and cost of the weak and the strong model, aligned with `traces`."""

    traces: list[Trace]
    q_weak: np.ndarray
    q_strong: np.ndarray
    c_weak: np.ndarray
    c_strong: np.ndarray

    @classmethod
    def of(cls, traces: Sequence[Trace], weak: str, strong: str) -> Outcomes:
        usable = [t for t in traces if weak in t.models and strong in t.models]
        if not usable:
            raise EvalError(f"no trace has outcomes for both {weak!r} and {strong!r}")

        def column(model: str, attr: str) -> np.ndarray:
            return np.array([getattr(t.models[model], attr) for t in usable], dtype=float)

        return cls(
            usable,
            column(weak, "quality"),
            column(strong, "quality"),
            column(weak, "cost_usd"),
            column(strong, "cost_usd"),
        )

    @property
    def quality_weak(self) -> float:
        return float(self.q_weak.mean())

    @property
    def quality_strong(self) -> float:
        return float(self.q_strong.mean())

    def curve(self, scores: np.ndarray) -> metrics.Curve:
        return metrics.routing_curve(scores, self.q_weak, self.q_strong, self.c_weak, self.c_strong)


@dataclass(frozen=True, slots=True)
class RouterResult:
    name: str
    is_fixed: bool
    is_reference: bool
    curve: metrics.Curve
    apgr: float
    cpt50: float
    cpt80: float
    cost_at_95_usd: float
    aiq: float


def resolve_models(traces: Sequence[Trace], meta: dict, weak: str | None, strong: str | None) -> tuple[str, str]:
    """Weak and strong model names: as given, else from the file's header, else the two models by cost."""
    weak = weak or meta.get("weak_model")
    strong = strong or meta.get("strong_model")
    if weak and strong:
        return weak, strong
    names = sorted({name for t in traces for name in t.models})
    if len(names) != 2:
        raise EvalError(f"the traces hold {len(names)} models ({', '.join(names)}); name them with --weak and --strong")
    mean_cost = {name: np.mean([t.models[name].cost_usd for t in traces if name in t.models]) for name in names}
    cheap, dear = sorted(names, key=lambda name: mean_cost[name])
    return weak or cheap, strong or dear


def split(traces: Sequence[Trace], name: str) -> list[Trace]:
    chosen = [t for t in traces if t.split == name]
    if not chosen:
        raise EvalError(f"the {name} split is empty")
    return chosen


def fixed_point(test: Outcomes, is_strong: bool) -> metrics.Curve:
    """A router that never varies has one operating point, not a curve."""
    q, c = (test.q_strong, test.c_strong) if is_strong else (test.q_weak, test.c_weak)
    return metrics.Curve(
        strong_share=np.array([float(is_strong)]),
        quality=np.array([q.mean()]),
        cost_usd=np.array([c.mean()]),
        thresholds=np.array([0.0 if is_strong else np.inf]),
    )


def evaluate_router(router: Router, test: Outcomes) -> RouterResult:
    qw, qs = test.quality_weak, test.quality_strong
    is_fixed = router.name in FIXED_ROUTERS
    if is_fixed:
        curve = fixed_point(test, is_strong=router.name == "always-strong")
    else:
        curve = test.curve(router.score(test.traces))
    return RouterResult(
        name=router.name,
        is_fixed=is_fixed,
        is_reference=router.is_reference,
        curve=curve,
        apgr=float("nan") if is_fixed else metrics.apgr(curve, qw, qs),
        cpt50=float("nan") if is_fixed else metrics.cpt(curve, 0.5, qw, qs),
        cpt80=float("nan") if is_fixed else metrics.cpt(curve, 0.8, qw, qs),
        cost_at_95_usd=metrics.cost_at_quality(curve, 0.95 * qs),
        aiq=float("nan")
        if is_fixed
        else metrics.aiq(curve.cost_usd, curve.quality, float(test.c_weak.mean()), float(test.c_strong.mean())),
    )


def evaluate_routers(
    routers: Sequence[Router],
    traces: Sequence[Trace],
    weak: str,
    strong: str,
    on_step: Callable[[str], None] = lambda name: None,
) -> tuple[Outcomes, list[RouterResult]]:
    train = Outcomes.of(split(traces, "train"), weak, strong)
    test = Outcomes.of(split(traces, "test"), weak, strong)
    results = []
    for router in routers:
        router.fit(train.traces, weak, strong)
        results.append(evaluate_router(router, test))
        on_step(router.name)
    return test, results
