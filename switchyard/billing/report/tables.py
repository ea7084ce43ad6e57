"""The report's tables (one CSV file each) and its JSON summary, shaped from an `Aggregator`.

Every figure on the page is drawn from these tables and shows them underneath, so what an
analyst sees plotted is exactly what the CSV files hold.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from switchyard.billing.report.aggregate import Aggregator, SavingsSums, Sums
from switchyard.billing.report.requests import OUTCOMES
from switchyard.billing.report.reservoir import Reservoir
from switchyard.core.prices import Price

COLUMNS: dict[str, tuple[str, ...]] = {
    "cost_by_team_day": (
        "day", "team", "requests", "attempts", "prompt_tokens", "completion_tokens", "cost_usd",
    ),
    "cost_by_key": (
        "team", "key_id", "key_prefix", "requests", "attempts", "prompt_tokens", "completion_tokens", "cost_usd",
    ),
    "cost_by_model_day": (
        "day", "model", "attempts", "completed", "prompt_tokens", "completion_tokens", "cost_usd",
    ),
    "route_mix": ("route", "requests", "share", *OUTCOMES, "cost_usd"),
    "escalation_by_day": ("day", "cascade_requests", "escalated_requests", "escalation_rate", "escalations"),
    "escalation_reasons": ("day", "reason", "escalations"),
    "savings_by_day": (
        "day", "route", "requests", "realised_cost_usd", "ceiling_cost_usd", "savings_usd", "savings_pct",
        "completed_without_ceiling",
    ),
    "cost_by_kind_day": (
        "day", "kind", "requests", "attempts", "prompt_tokens", "completion_tokens", "cost_usd",
    ),
    "cost_by_hosting": ("hosting", "attempts", "prompt_tokens", "completion_tokens", "cost_usd", "usd_per_mtok"),
    "models": (
        "model", "hosting", "attempts", "completed", "prompt_tokens", "completion_tokens", "cost_usd",
        "usd_per_mtok", "price_input_usd_per_mtok", "price_output_usd_per_mtok",
    ),
    "latency_by_model": (
        "model", "latency_samples", "p50_latency_ms", "p95_latency_ms", "ttft_samples", "p50_ttft_ms", "p95_ttft_ms",
    ),
}  # fmt: skip
ROUTE_ORDER = ("auto:", "cascade:accepted", "cascade:escalated", "direct", "unrecorded")

Cell = str | int | float | date | None
Row = tuple[Cell, ...]


@dataclass(frozen=True, slots=True)
class Table:
    name: str  # the CSV file is f"{name}.csv"
    columns: tuple[str, ...]
    rows: tuple[Row, ...]

    @property
    def file_name(self) -> str:
        return f"{self.name}.csv"

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows([csv_cell(v) for v in row] for row in self.rows)
        return out.getvalue()


def csv_cell(value: Cell) -> str | int:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 9)) if math.isfinite(value) else ""
    return value.isoformat() if isinstance(value, date) else value


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _route_rank(label: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(ROUTE_ORDER) if label.startswith(p)), len(ROUTE_ORDER)), label


def build_tables(
    agg: Aggregator, prices: Mapping[str, Price] | None = None, key_prefixes: Mapping[str, str] | None = None
) -> dict[str, Table]:
    prices, key_prefixes = prices or {}, key_prefixes or {}
    rows: dict[str, list[Row]] = {name: [] for name in COLUMNS}
    for (team, key_id), s in sorted(agg.by_key.items(), key=lambda item: (-item[1].cost_usd, item[0])):
        rows["cost_by_key"].append(
            (team, key_id, key_prefixes.get(key_id), s.requests, s.attempts, s.prompt_tokens, s.completion_tokens)
            + (s.cost_usd,)
        )
    for (day, team), s in sorted(agg.by_team_day.items()):
        rows["cost_by_team_day"].append(
            (day, team, s.requests, s.attempts, s.prompt_tokens, s.completion_tokens, s.cost_usd)
        )
    for (day, model), s in sorted(agg.by_model_day.items()):
        rows["cost_by_model_day"].append(
            (day, model, s.attempts, s.completed, s.prompt_tokens, s.completion_tokens, s.cost_usd)
        )
    for label, r in sorted(agg.route_mix.items(), key=lambda item: _route_rank(item[0])):
        share = _ratio(r.requests, agg.num_requests)
        rows["route_mix"].append((label, r.requests, share, *(r.outcomes[o] for o in OUTCOMES), r.cost_usd))
    escalations_by_day: Counter[date] = Counter()
    for (day, _), n in agg.escalations.items():
        escalations_by_day[day] += n
    for day in sorted(set(agg.cascade_by_day) | set(escalations_by_day)):
        c = agg.cascade_by_day.get(day)
        num_requests, num_escalated = (c.requests, c.escalated) if c else (0, 0)
        rows["escalation_by_day"].append(
            (day, num_requests, num_escalated, _ratio(num_escalated, num_requests), escalations_by_day[day])
        )
    for (day, reason), n in sorted(agg.escalations.items()):
        rows["escalation_reasons"].append((day, reason, n))
    for (day, kind), savings in sorted(agg.savings.items()):
        rows["savings_by_day"].append((day, kind, *_savings_columns(savings)))
    for (day, kind), s in sorted(agg.by_kind_day.items()):
        rows["cost_by_kind_day"].append(
            (day, kind, s.requests, s.attempts, s.prompt_tokens, s.completion_tokens, s.cost_usd)
        )
    for hosting, s in sorted(agg.by_hosting.items()):
        rows["cost_by_hosting"].append(
            (hosting, s.attempts, s.prompt_tokens, s.completion_tokens, s.cost_usd, s.usd_per_mtok)
        )
    for model, s in sorted(agg.by_model.items()):
        price = prices.get(model)
        price_in, price_out = (price.input_usd_per_mtok, price.output_usd_per_mtok) if price else (None, None)
        rows["models"].append(
            (
                model, agg.hosting_of_model.get(model, "unknown"), s.attempts, s.completed, s.prompt_tokens,
                s.completion_tokens, s.cost_usd, s.usd_per_mtok, price_in, price_out,
            )
        )  # fmt: skip
    for model in sorted(set(agg.latency_ms) | set(agg.ttft_ms)):
        latency, ttft = agg.latency_ms.get(model), agg.ttft_ms.get(model)
        rows["latency_by_model"].append((model, *_percentiles(latency), *_percentiles(ttft)))
    return {name: Table(name, COLUMNS[name], tuple(rows[name])) for name in COLUMNS}


def _percentiles(reservoir: Reservoir | None) -> tuple[int, float | None, float | None]:
    """Samples seen, p50 and p95."""
    if not reservoir:
        return 0, None, None
    return reservoir.num_seen, reservoir.percentile(50), reservoir.percentile(95)


def _savings_columns(s: SavingsSums) -> tuple[int, float, float, float, float | None, int]:
    return (
        s.requests, s.realised_cost_usd, s.ceiling_cost_usd, s.savings_usd, s.savings_pct, s.num_without_ceiling,
    )  # fmt: skip


def build_summary(agg: Aggregator) -> dict[str, Any]:
    """Headline numbers (the JSON summary's body, without the period and file list)."""
    routed = SavingsSums()
    for s in agg.savings.values():
        routed.requests += s.requests
        routed.realised_cost_usd += s.realised_cost_usd
        routed.ceiling_cost_usd += s.ceiling_cost_usd
        routed.num_without_ceiling += s.num_without_ceiling
    num_cascade = sum(c.requests for c in agg.cascade_by_day.values())
    num_escalated = sum(c.escalated for c in agg.cascade_by_day.values())
    reasons: dict[str, int] = {}
    for (_, reason), n in sorted(agg.escalations.items(), key=lambda item: item[0][1]):
        reasons[reason] = reasons.get(reason, 0) + n
    days = sorted({day for day, _ in agg.by_team_day})
    kinds: dict[str, Sums] = defaultdict(Sums)
    for (_, kind), sums in agg.by_kind_day.items():
        kinds[kind].merge(sums)
    t = agg.totals
    return {
        "first_day": days[0].isoformat() if days else None,
        "last_day": days[-1].isoformat() if days else None,
        "records": agg.num_records,
        "requests": agg.num_requests,
        "attempts": t.attempts,
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "cost_usd": t.cost_usd,
        "savings": {
            "routed_requests": routed.requests,
            "realised_cost_usd": routed.realised_cost_usd,
            "ceiling_cost_usd": routed.ceiling_cost_usd,
            "savings_usd": routed.savings_usd,
            "savings_pct": routed.savings_pct,
            "completed_without_ceiling": routed.num_without_ceiling,
        },
        "escalation": {
            "cascade_requests": num_cascade,
            "escalated_requests": num_escalated,
            "rate": _ratio(num_escalated, num_cascade),
            "reasons": reasons,
        },
        "route_mix": {label: r.requests for label, r in sorted(agg.route_mix.items())},
        "hosting": {
            hosting: {"tokens": s.tokens, "cost_usd": s.cost_usd, "usd_per_mtok": s.usd_per_mtok}
            for hosting, s in sorted(agg.by_hosting.items())
        },
        "kinds": {
            kind: {"requests": s.requests, "tokens": s.tokens, "cost_usd": s.cost_usd}
            for kind, s in sorted(kinds.items())
        },
    }
