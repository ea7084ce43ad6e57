"""Routing among N tiers by value, offline: what each tolerance buys on labelled prompts, and the
tolerance each quality mode gets (`switchyard eval tiers`). The rule is the proxy's
(`classifier.by_value.pick_by_value`), applied to whole matrices at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from switchyard.core.traces import Trace
from switchyard.evals.datasets import prompt_hash

MODE_TARGETS = {"economy": 0.90, "balanced": 0.95, "max": 0.99}  # of the best single tier's quality
TOLERANCES = np.round(np.arange(0, 1.0001, 0.0025), 4)


@dataclass(frozen=True)
class TierData:
    """Prompts that carry every tier model's outcome: real quality and cost, one column a tier."""

    traces: list[Trace]
    quality: np.ndarray  # (n, tiers)
    cost: np.ndarray  # (n, tiers), USD

    @classmethod
    def of(cls, traces: Sequence[Trace], models: Sequence[str]) -> TierData:
        kept = [t for t in traces if all(m in t.models for m in models)]
        quality = np.array([[t.models[m].quality for m in models] for t in kept]).reshape(-1, len(models))
        cost = np.array([[t.models[m].cost_usd for m in models] for t in kept]).reshape(-1, len(models))
        return cls(kept, quality, cost)

    def best_tier(self) -> int:
        """The tier with the highest mean quality (the lower one on a tie)."""
        means = self.quality.mean(axis=0)
        return int(np.flatnonzero(means == means.max())[0])


def tuning_and_test(traces: Sequence[Trace], artifact_saw_train: bool) -> tuple[list[Trace], list[Trace], str]:
    """Where the tolerances are picked, where they are reported, and how to say it. An artifact
    trained on this data's train split predicts it in-sample, so picking there would promise more
    than held-out prompts give: the test split is then halved by prompt hash, one half to pick
    on, the other to report."""
    train = [t for t in traces if t.split == "train"]
    test = [t for t in traces if t.split == "test"]
    if not artifact_saw_train:
        return train, test, "picked on the train split, reported on the test split"
    halves = (
        [t for t in test if int(prompt_hash(t.prompt)[-1], 16) % 2 == 0],
        [t for t in test if int(prompt_hash(t.prompt)[-1], 16) % 2 == 1],
    )
    return (
        *halves,
        "picked on half the test split, reported on the other half (the artifact was trained on the train split)",
    )


def random_at(data: TierData, cost_usd_per_1k: float) -> float:
    """The quality a random split between the cheapest tier and the best one gets at that cost
    (the straight line between the two alone; the baseline a router must beat)."""
    means_q, means_c = data.quality.mean(axis=0), 1000 * data.cost.mean(axis=0)
    cheap, best = int(np.argmin(means_c)), data.best_tier()
    if means_c[best] <= means_c[cheap]:
        return float(means_q[best])
    share = float(np.clip((cost_usd_per_1k - means_c[cheap]) / (means_c[best] - means_c[cheap]), 0, 1))
    return float(means_q[cheap] + share * (means_q[best] - means_q[cheap]))


def route_by_value(predicted: np.ndarray, costs: np.ndarray, tolerance: float) -> np.ndarray:
    """The tier `pick_by_value` chooses for each row: the cheapest tier (then the better predicted,
    then the lowest) whose predicted quality is within `tolerance` of the row's best."""
    n, tiers = predicted.shape
    best = predicted.max(axis=1, keepdims=True)
    eligible = predicted >= best - tolerance
    # rank of each tier by (cost, -predicted, index) within its row; the eligible tier of the lowest rank wins
    order = np.lexsort((np.broadcast_to(np.arange(tiers), (n, tiers)), -predicted, costs), axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(tiers)[None, :].repeat(n, axis=0), axis=1)
    return np.argmin(np.where(eligible, rank, tiers), axis=1)


def operating_point(data: TierData, chosen: np.ndarray, tier_names: Sequence[str]) -> dict:
    rows = np.arange(len(chosen))
    return {
        "quality": round(float(data.quality[rows, chosen].mean()), 6),
        "cost_usd_per_1k": round(1000 * float(data.cost[rows, chosen].mean()), 6),
        "share": {name: round(float((chosen == i).mean()), 6) for i, name in enumerate(tier_names)},
    }


def sweep(data: TierData, predicted: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Realised mean quality and mean cost per prompt at each of `TOLERANCES`."""
    rows = np.arange(len(data.traces))
    quality, cost = np.empty(len(TOLERANCES)), np.empty(len(TOLERANCES))
    for k, tolerance in enumerate(TOLERANCES):
        chosen = route_by_value(predicted, costs, float(tolerance))
        quality[k], cost[k] = data.quality[rows, chosen].mean(), data.cost[rows, chosen].mean()
    return quality, cost


def pick_tolerance(data: TierData, predicted: np.ndarray, costs: np.ndarray, quality_fraction: float) -> float:
    """The largest tolerance (the cheapest routing) whose realised quality reaches
    `quality_fraction` of the best single tier's; 0 when none does."""
    target = quality_fraction * data.quality[:, data.best_tier()].mean()
    quality, _ = sweep(data, predicted, costs)
    reached = np.flatnonzero(quality >= target - 1e-12)
    return float(TOLERANCES[reached[-1]]) if len(reached) else 0.0


def tune_modes(
    tuning: TierData,
    tuning_predicted: np.ndarray,
    test: TierData,
    test_predicted: np.ndarray,
    tier_names: Sequence[str],
) -> dict[str, dict]:
    """Each quality mode's tolerance, picked on `tuning`, with its operating point on both splits."""
    modes = {}
    for mode, fraction in MODE_TARGETS.items():
        tolerance = pick_tolerance(tuning, tuning_predicted, tuning.cost, fraction)
        modes[mode] = {
            "tolerance": tolerance,
            "target": {"quality_fraction": fraction},
            "tuning": operating_point(tuning, route_by_value(tuning_predicted, tuning.cost, tolerance), tier_names),
            "test": operating_point(test, route_by_value(test_predicted, test.cost, tolerance), tier_names),
        }
    return modes


def write_plot(
    path, title: str, data: TierData, sweep_points: tuple[np.ndarray, np.ndarray], tier_names, modes: dict
) -> None:
    """Quality against cost as the tolerance grows (test split), each tier alone, the modes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality, cost = sweep_points
    fig, axis = plt.subplots(figsize=(7, 5))
    axis.plot(cost * 1000, quality, label="by value, tolerance 0 to 1")
    means = 1000 * data.cost.mean(axis=0)
    ends = np.array([means.min(), means[data.best_tier()]])
    axis.plot(ends, [random_at(data, c) for c in ends], "--", color="grey", label="random (cheapest and best tier)")
    for mode, point in modes.items():
        axis.plot(
            point["cost_usd_per_1k"], point["quality"], "*", markersize=14, label=f"{mode} (tol {point['tolerance']})"
        )
    for i, name in enumerate(tier_names):  # above the stars: a mode that is one tier alone hides no tier
        mean_cost, mean_quality = data.cost[:, i].mean() * 1000, data.quality[:, i].mean()
        axis.plot(mean_cost, mean_quality, "o", markeredgecolor="black", zorder=3, label=f"{name} alone")
    axis.set_xlabel("cost (USD per 1k prompts)")
    axis.set_ylabel("quality (share answered correctly)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="best")  # not over a tier's point
    axis.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
