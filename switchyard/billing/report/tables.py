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

from switchyard.billing.report.aggregate import SHADOW, Aggregator, EscalationSums, SavingsSums, Sums
from switchyard.billing.report.drift import (
    DRIFT_BINS_COLUMNS,
    DRIFT_BY_DAY_COLUMNS,
    DRIFT_COLUMNS,
    drift_rows,
    drift_summary,
)
from switchyard.billing.report.refusals import COLUMNS as REFUSAL_COLUMNS
from switchyard.billing.report.refusals import refusal_rows, refusals_summary
from switchyard.billing.report.requests import OUTCOMES, ROUTED_KINDS
from switchyard.billing.report.reservoir import Reservoir
from switchyard.billing.report.versions import COLUMNS as VERSION_COLUMNS
from switchyard.billing.report.versions import version_rows
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
    "cost_by_team_model": (
        "team", "model", "requests", "attempts", "prompt_tokens", "completion_tokens", "cost_usd",
        "cache_read_tokens", "cache_write_tokens",
    ),
    "route_mix": ("route", "requests", "share", *OUTCOMES, "cost_usd"),
    "escalation_by_day": ("day", "entry", "requests", "escalated_requests", "escalation_rate"),
    "escalation_reasons": ("day", "entry", "reason", "escalated_requests"),
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
        "cache_read_tokens", "cache_write_tokens", "cache_saved_usd", "price_cached_input_usd_per_mtok",
        "price_cache_write_usd_per_mtok",
    ),
    "latency_by_model": (
        "model", "latency_samples", "p50_latency_ms", "p95_latency_ms", "ttft_samples", "p50_ttft_ms", "p95_ttft_ms",
    ),
    "latency_by_route": (
        "route", "requests", "p50_ttfb_ms", "p95_ttfb_ms", "p50_duration_ms", "p95_duration_ms", "p50_added_ms",
        "p95_added_ms",
    ),
    "confidence_by_model": (
        "model", "threshold", "judged", "below_threshold", "without_confidence", "min_confidence", "max_confidence",
    ),
    "confidence_histogram": ("model", "bin_low", "bin_high", "answers"),
    "drift": DRIFT_COLUMNS,
    "drift_by_day": DRIFT_BY_DAY_COLUMNS,
    "drift_bins": DRIFT_BINS_COLUMNS,
    "refusals": REFUSAL_COLUMNS,
    "routing_versions": VERSION_COLUMNS,
}  # fmt: skip
ROUTE_ORDER = ("auto:", "cascade:accepted", "cascade:escalated", "cascade:failed", "direct", "unrecorded")

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
    for (team, model), s in sorted(agg.by_team_model.items()):
        rows["cost_by_team_model"].append(
            (
                team,
                model,
                s.requests,
                s.attempts,
                s.prompt_tokens,
                s.completion_tokens,
                s.cost_usd,
                s.cache_read_tokens,
                s.cache_write_tokens,
            )  # fmt: skip
        )
    for label, r in sorted(agg.route_mix.items(), key=lambda item: _route_rank(item[0])):
        share = _ratio(r.requests, agg.num_requests)
        rows["route_mix"].append((label, r.requests, share, *(r.outcomes[o] for o in OUTCOMES), r.cost_usd))
    for (day, entry), e in sorted(agg.escalation_by_day.items()):
        rows["escalation_by_day"].append((day, entry, e.requests, e.escalated, e.rate))
    for (day, entry, reason), n in sorted(agg.escalation_reasons.items()):
        rows["escalation_reasons"].append((day, entry, reason, n))
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
        price_read, price_write = (
            (price.cached_input_usd_per_mtok, price.cache_write_usd_per_mtok) if price else (None, None)
        )
        rows["models"].append(
            (
                model, agg.hosting_of_model.get(model, "unknown"), s.attempts, s.completed, s.prompt_tokens,
                s.completion_tokens, s.cost_usd, s.usd_per_mtok, price_in, price_out,
                s.cache_read_tokens, s.cache_write_tokens, cache_saved_usd(s, price), price_read, price_write,
            )
        )  # fmt: skip
    for model in sorted(set(agg.latency_ms) | set(agg.ttft_ms)):
        latency, ttft = agg.latency_ms.get(model), agg.ttft_ms.get(model)
        rows["latency_by_model"].append((model, *_percentiles(latency), *_percentiles(ttft)))
    rows["latency_by_route"].extend(build_latency_by_route(agg).rows)
    confidence = agg.confidence
    for (model, threshold), j in sorted(confidence.judged.items()):
        rows["confidence_by_model"].append(
            (model, threshold, j.num_judged, j.num_below, j.num_without, j.lowest, j.highest)
        )
    for model in sorted(confidence.scores):
        rows["confidence_histogram"].extend((model, *bin) for bin in confidence.histogram(model))
    for name, drift in drift_rows(agg.drift).items():
        rows[name].extend(drift)
    rows["refusals"].extend(refusal_rows(agg.refusals, key_prefixes))
    rows["routing_versions"].extend(version_rows(agg.by_version))
    return {name: Table(name, COLUMNS[name], tuple(rows[name])) for name in COLUMNS}


def cache_saved_usd(sums: Sums, price: Price | None) -> float | None:
    """What prompt caching saved on these attempts against pricing every prompt token as plain
    input: reads at the cached price, less what writes cost above it (negative: it cost more;
    None: no price)."""
    if price is None:
        return None
    if not (sums.cache_read_tokens or sums.cache_write_tokens):
        return 0.0
    plain = price.cost_usd(sums.prompt_tokens, 0)
    return plain - price.cost_usd(sums.prompt_tokens, 0, sums.cache_read_tokens, sums.cache_write_tokens)


def build_latency_by_route(agg: Aggregator) -> Table:
    """As the client saw it, per route: p50 and p95 of the time to first byte, of the total time,
    and of the total beyond the answering attempt's own duration (what the route added)."""
    rows: list[Row] = []
    for label in sorted(agg.client_duration_ms, key=_route_rank):
        ttfb, added = agg.client_ttfb_ms.get(label), agg.client_added_ms.get(label)
        num_requests, *duration_ms = _percentiles(agg.client_duration_ms[label])
        rows.append((label, num_requests, *_percentiles(ttfb)[1:], *duration_ms, *_percentiles(added)[1:]))
    return Table("latency_by_route", COLUMNS["latency_by_route"], tuple(rows))


def _percentiles(reservoir: Reservoir | None) -> tuple[int, float | None, float | None]:
    """Samples seen, p50 and p95."""
    if not reservoir:
        return 0, None, None
    return reservoir.num_seen, reservoir.percentile(50), reservoir.percentile(95)


def _savings_columns(s: SavingsSums) -> tuple[int, float, float, float, float | None, int]:
    return (
        s.requests, s.realised_cost_usd, s.ceiling_cost_usd, s.savings_usd, s.savings_pct, s.num_without_ceiling,
    )  # fmt: skip


def build_summary(agg: Aggregator, prices: Mapping[str, Price] | None = None) -> dict[str, Any]:
    """Headline numbers (the JSON summary's body, without the period and file list); `prices`
    (model -> `Price`) for what prompt caching saved."""
    routed = SavingsSums()
    for s in agg.savings.values():
        routed.requests += s.requests
        routed.realised_cost_usd += s.realised_cost_usd
        routed.ceiling_cost_usd += s.ceiling_cost_usd
        routed.num_without_ceiling += s.num_without_ceiling
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
        "shadow_cost_usd": kinds[SHADOW].cost_usd if SHADOW in kinds else 0.0,  # in cost_usd, paid by the platform
        "cache_read_tokens": t.cache_read_tokens,  # among prompt_tokens
        "cache_write_tokens": t.cache_write_tokens,
        "cache_saved_usd": _cache_saved_usd(agg, prices or {}),
        "response_cache": {
            "hits": t.response_cache_hits,
            "misses": t.response_cache_misses,
            "hit_rate": _share(t.response_cache_hits, t.response_cache_hits + t.response_cache_misses),
            "saved_usd": t.response_cache_saved_usd,
        },
        "savings": {
            "routed_requests": routed.requests,
            "realised_cost_usd": routed.realised_cost_usd,
            "ceiling_cost_usd": routed.ceiling_cost_usd,
            "savings_usd": routed.savings_usd,
            "savings_pct": routed.savings_pct,
            "completed_without_ceiling": routed.num_without_ceiling,
        },
        "escalation": _escalation(agg),
        "latency_by_route": _latency_by_route(agg),
        "route_mix": {label: r.requests for label, r in sorted(agg.route_mix.items())},
        "hosting": {
            hosting: {"tokens": s.tokens, "cost_usd": s.cost_usd, "usd_per_mtok": s.usd_per_mtok}
            for hosting, s in sorted(agg.by_hosting.items())
        },
        "kinds": {
            kind: {"requests": s.requests, "tokens": s.tokens, "cost_usd": s.cost_usd}
            for kind, s in sorted(kinds.items())
        },
        "cost_by_team_model": _by_team_model(agg),
        "refusals": refusals_summary(agg.refusals),
        "routing_versions": [dict(zip(VERSION_COLUMNS, row, strict=True)) for row in version_rows(agg.by_version)],
        "drift": drift_summary(agg.drift),  # None: no reference in the thresholds file
        "previous": None,  # the previous period and the change from it: `compare.compare_periods`
        "change": None,
    }


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _escalation(agg: Aggregator) -> dict[str, dict[str, Any]]:
    """Per entry point (auto, cascade): its requests, those a rung other than the first answered,
    the rate, and why they left their first rung."""
    sums = {entry: EscalationSums() for entry in ROUTED_KINDS}
    for (_, entry), e in agg.escalation_by_day.items():
        sums[entry].requests += e.requests
        sums[entry].escalated += e.escalated
    reasons: dict[str, Counter[str]] = {entry: Counter() for entry in ROUTED_KINDS}
    for (_, entry, reason), n in agg.escalation_reasons.items():
        reasons[entry][reason] += n
    return {
        entry: {
            "requests": e.requests,
            "escalated_requests": e.escalated,
            "rate": e.rate,
            "reasons": dict(sorted(reasons[entry].items())),
        }
        for entry, e in sums.items()
    }


def _latency_by_route(agg: Aggregator) -> dict[str, dict[str, Any]]:
    table = build_latency_by_route(agg)
    return {row["route"]: {k: v for k, v in row.items() if k != "route"} for row in table.records()}


def _cache_saved_usd(agg: Aggregator, prices: Mapping[str, Price]) -> float:
    """`cache_saved_usd` over every priced model."""
    saved = (cache_saved_usd(s, prices.get(model)) for model, s in agg.by_model.items())
    return sum(usd for usd in saved if usd is not None)


def _by_team_model(agg: Aggregator) -> dict[str, dict[str, dict[str, float | int]]]:
    by_team: dict[str, dict[str, dict[str, float | int]]] = {}
    for (team, model), s in sorted(agg.by_team_model.items()):
        by_team.setdefault(team, {})[model] = {"requests": s.requests, "tokens": s.tokens, "cost_usd": s.cost_usd}
    return by_team
