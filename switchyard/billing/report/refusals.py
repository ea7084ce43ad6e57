"""Refused requests in the report: counted per team, key and reason, apart from every other figure.

A refusal's ledger record (status `refused`, `switchyard.billing.refusals`) never called a model:
it has no tokens, cost or latency, and is no request in the cost, route, escalation, savings or
latency figures. It is counted here only: `refusals.csv`, the summary's `refusals` block and the
page's refusals table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from switchyard.billing.records import UsageRecord

COLUMNS = ("team", "key_id", "key_prefix", "reason", "refusals")
NO_REASON = "unspecified"


@dataclass(slots=True)
class Refusals:
    by_key: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (team, key id, reason)

    def add(self, record: UsageRecord, team: str, key_id: str) -> None:
        self.by_key[(team, key_id, record.error or NO_REASON)] += 1

    @property
    def total(self) -> int:
        return sum(self.by_key.values())


def refusal_rows(refusals: Refusals, key_prefixes: Mapping[str, str]) -> list[tuple[str, str, str | None, str, int]]:
    """Most refused first, then by team, key and reason."""
    ordered = sorted(refusals.by_key.items(), key=lambda item: (-item[1], item[0]))
    return [(team, key_id, key_prefixes.get(key_id), reason, n) for (team, key_id, reason), n in ordered]


def refusals_summary(refusals: Refusals) -> dict[str, Any]:
    """The summary's `refusals` block: the total, by reason, and by team and reason."""
    by_reason: Counter[str] = Counter()
    by_team: dict[str, Counter[str]] = {}
    for (team, _, reason), n in refusals.by_key.items():
        by_reason[reason] += n
        by_team.setdefault(team, Counter())[reason] += n
    return {
        "total": refusals.total,
        "by_reason": dict(sorted(by_reason.items())),
        "by_team": {team: dict(sorted(reasons.items())) for team, reasons in sorted(by_team.items())},
    }
