"""Routing among N tiers by value: each tier's quality on the prompt is predicted (the artifact's
matrix-factorisation head scores any model it was trained on), and the request goes to the
cheapest tier whose predicted quality is within the quality mode's tolerance of the best tier's.

A tier is priced by what the request is estimated to cost on it. Among tiers of equal price the
higher predicted quality wins, then the lower tier. (The router prices tiers by their order when
a tier's model has no price.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Predicted-quality points (0..1) a tier may fall short of the best tier and still be chosen.
DEFAULT_TOLERANCES = {"economy": 0.10, "balanced": 0.05, "max": 0.02}


@dataclass(frozen=True, slots=True)
class ValuePick:
    chosen: int  # tier index
    best: int  # the tier with the highest predicted quality
    margin: float  # how near the decision was to changing (quality points)


def pick_by_value(qualities: Sequence[float], costs: Sequence[float], tolerance: float) -> ValuePick:
    """The cheapest tier whose quality is within `tolerance` of the best; on a tie of price the
    better predicted, then the lowest."""
    if not qualities or len(qualities) != len(costs):
        raise ValueError(f"{len(qualities)} qualities for {len(costs)} tiers")
    best = max(range(len(qualities)), key=lambda i: (qualities[i], -i))
    floor = qualities[best] - tolerance
    within = [i for i, q in enumerate(qualities) if q >= floor]
    chosen = min(within, key=lambda i: (costs[i], -qualities[i], i))
    # the nearest any tier came to crossing the floor, one way or the other
    others = [abs(q - floor) for i, q in enumerate(qualities) if i != best]
    return ValuePick(chosen, best, min(others) if others else 1.0)


@dataclass(frozen=True, slots=True)
class ValueRule:
    """What routing by value needs: each tier's model as the artifact knows it (in tier order) and
    each quality mode's tolerance."""

    quality_models: tuple[str, ...]
    tolerances: dict[str, float]

    def tolerance(self, mode: str) -> float:
        return self.tolerances.get(mode, self.tolerances["balanced"])
