"""Routing versions side by side: what each version that routed `auto` and `cascade` requests
(`UsageRecord.routing_version`, `switchyard.gateway.routings`) came to, so that a rollout's
candidate can be judged against the current version before it is promoted.

Per version and entry point: requests, their cost and cost per request, the escalation rate
(a rung other than the first answered: `escalation_outcome`), the strong-call share (answered at
the cost of the strongest model the route could reach: `ceiling_cost_usd`; priced answers only),
and the judged quality of the answers when labels exist (`judged`: request id -> the answer's
quality in 0..1, from the learning rows of shadow sampling and feedback, joined by request id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COLUMNS = (
    "version", "entry", "requests", "cost_usd", "cost_per_request_usd", "escalated_requests", "escalation_rate",
    "priced_answers", "strong_answers", "strong_share", "judged_requests", "judged_quality",
)  # fmt: skip
ROW_ORDER = ("auto", "cascade")


@dataclass(slots=True)
class VersionSums:
    """The requests one routing version routed through one entry point."""

    requests: int = 0
    cost_usd: float = 0.0
    escalated: int = 0
    priced: int = 0  # answers whose strongest-model cost is known and above zero
    strong: int = 0  # of those, answered at that cost
    judged: int = 0
    quality_sum: float = 0.0

    def add(self, *, cost_usd: float, is_escalated: bool, is_strong: bool | None, quality: float | None) -> None:
        self.requests += 1
        self.cost_usd += cost_usd
        self.escalated += is_escalated
        if is_strong is not None:
            self.priced += 1
            self.strong += is_strong
        if quality is not None:
            self.judged += 1
            self.quality_sum += quality

    def row(self, version: str, entry: str) -> tuple[Any, ...]:
        return (
            version,
            entry,
            self.requests,
            self.cost_usd,
            self.cost_usd / self.requests if self.requests else None,
            self.escalated,
            self.escalated / self.requests if self.requests else None,
            self.priced,
            self.strong,
            self.strong / self.priced if self.priced else None,
            self.judged,
            self.quality_sum / self.judged if self.judged else None,
        )


def is_strong_answer(answer_cost_usd: float | None, answer_ceiling_usd: float | None) -> bool | None:
    """Whether an answer cost what the strongest model reachable would have (None: not known)."""
    if answer_cost_usd is None or answer_ceiling_usd is None or answer_ceiling_usd <= 0:
        return None
    return answer_cost_usd >= answer_ceiling_usd * (1 - 1e-9)


def version_rows(by_version: Mapping[tuple[str, str], VersionSums]) -> list[tuple[Any, ...]]:
    """One row per (version, entry), the busiest version first."""
    busiest: dict[str, int] = {}
    for (version, _), sums in by_version.items():
        busiest[version] = busiest.get(version, 0) + sums.requests
    ordered = sorted(
        by_version.items(), key=lambda item: (-busiest[item[0][0]], item[0][0], ROW_ORDER.index(item[0][1]))
    )
    return [sums.row(version, entry) for (version, entry), sums in ordered]
