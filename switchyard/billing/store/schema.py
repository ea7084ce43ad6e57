"""What both databases share: the usage columns, row conversions, the team fields a change may set."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import fields
from operator import attrgetter
from typing import Any

from switchyard.billing.records import UsageRecord
from switchyard.billing.teams import ApiKey, Team
from switchyard.core.prices import round_usd

USAGE_COLUMNS = tuple(f.name for f in fields(UsageRecord))
USAGE_BOOLEANS = frozenset({"is_estimated", "is_hedge", "is_shadow"})
TEAM_COLUMNS = ("name", "models", "budget_usd_per_day", "budget_usd_per_month", "rpm", "tpm", "priority")
TEAM_CHANGEABLE = frozenset(TEAM_COLUMNS) - {"name"}
KEY_COLUMNS = (
    "id",
    "team",
    "prefix",
    "digest",
    "budget_usd_per_day",
    "budget_usd_per_month",
    "rpm",
    "tpm",
    "created_at",
    "expires_at",
    "revoked_at",
)
USAGE_GROUPS = ("key", "team", "model", "day", "route")  # /v1/usage's group_by
GROUP_BY = (None, *USAGE_GROUPS)


_USAGE_GETTER = attrgetter(*USAGE_COLUMNS)


def usage_values(record: UsageRecord) -> tuple[Any, ...]:
    """The record's values in USAGE_COLUMNS order (all scalars: `astuple` would deep-copy each)."""
    return _USAGE_GETTER(record)


def after_earlier(record: UsageRecord, attempts_before: dict[str, int]) -> UsageRecord:
    """`record` numbered after the attempts its request already has."""
    before = attempts_before.get(record.request_id, 0)
    return dataclasses.replace(record, attempt=before + record.attempt) if before else record


def usage_from_row(row: Any) -> UsageRecord:
    values = dict(zip(USAGE_COLUMNS, tuple(row), strict=True))
    for name in USAGE_BOOLEANS:
        values[name] = bool(values[name])
    return UsageRecord(**values)


def models_to_text(models: frozenset[str] | None) -> str | None:
    return None if models is None else json.dumps(sorted(models))


def team_values(team: Team) -> tuple[str, str | None, float | None, float | None, int | None, int | None, str]:
    return (
        team.name,
        models_to_text(team.models),
        team.budget_usd_per_day,
        team.budget_usd_per_month,
        team.rpm,
        team.tpm,
        team.priority,
    )


def team_from_row(row: Any) -> Team:
    name, models, day, month, rpm, tpm, priority = tuple(row)
    return Team(
        name,
        None if models is None else frozenset(json.loads(models)),
        day,
        month,
        rpm,
        tpm,
        priority,
        source="database",
    )


def check_team_changes(changes: dict[str, Any]) -> None:
    unknown = set(changes) - TEAM_CHANGEABLE
    if unknown:
        raise ValueError(
            f"a team has no field {', '.join(sorted(unknown))}; known: {', '.join(sorted(TEAM_CHANGEABLE))}"
        )


def key_from_row(row: Any) -> ApiKey:
    values = dict(zip(KEY_COLUMNS, tuple(row), strict=True))
    values["digest"] = bytes(values["digest"])
    return ApiKey(**values)


def check_group_by(group_by: str | None) -> None:
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(USAGE_GROUPS)}, not {group_by!r}")


_SUMS = (
    "SUM(cost_usd), SUM(prompt_tokens), SUM(completion_tokens), SUM(requests), SUM(batch_requests), "
    "SUM(batch_cost_usd), SUM(shadow_cost_usd), SUM(cache_read_tokens), SUM(cache_write_tokens), "
    "SUM(response_cache_hits), SUM(response_cache_misses), SUM(response_cache_bypasses), "
    "SUM(response_cache_saved_usd)"
)
# Shadow calls (switchyard.learning) are paid by the platform: their cost is counted apart.
_ATTEMPT_SUMS = (
    "SUM(CASE WHEN is_shadow THEN 0 ELSE cost_usd END) AS cost_usd, SUM(prompt_tokens) AS prompt_tokens, "
    "SUM(completion_tokens) AS completion_tokens, "
    "SUM(CASE WHEN attempt = 1 THEN 1 ELSE 0 END) AS requests, "
    "SUM(CASE WHEN attempt = 1 AND batch_id IS NOT NULL THEN 1 ELSE 0 END) AS batch_requests, "
    "SUM(CASE WHEN batch_id IS NULL THEN 0 ELSE cost_usd END) AS batch_cost_usd, "
    "SUM(CASE WHEN is_shadow THEN cost_usd ELSE 0 END) AS shadow_cost_usd, "
    "SUM(COALESCE(cache_read_tokens, 0)) AS cache_read_tokens, "
    "SUM(COALESCE(cache_write_tokens, 0)) AS cache_write_tokens, "
    "SUM(CASE WHEN response_cache = 'hit' THEN 1 ELSE 0 END) AS response_cache_hits, "
    "SUM(CASE WHEN response_cache = 'miss' THEN 1 ELSE 0 END) AS response_cache_misses, "
    "SUM(CASE WHEN response_cache = 'bypass' THEN 1 ELSE 0 END) AS response_cache_bypasses, "
    "SUM(COALESCE(response_cache_saved_usd, 0)) AS response_cache_saved_usd"
)
# A request's route, as the report's route mix names it (`auto:<tier>`, with the tier of the first
# model tried, `auto:<tier>→<tier>` when it escalated; `cascade:accepted`, `cascade:escalated` or
# `cascade:failed`; `direct`; `unrecorded` for rows written before the ledger kept what was asked for).
_REQUEST_KIND = (
    "CASE WHEN MAX(requested_model) IN ('auto', 'cascade') THEN MAX(requested_model) "
    "WHEN MAX(requested_model) IS NOT NULL THEN 'direct' "
    "WHEN MAX(route) LIKE 'auto%' THEN 'auto' WHEN MAX(route) LIKE 'cascade%' THEN 'cascade' "
    "ELSE 'unrecorded' END"
)
# Escalated as the report and /metrics count it (`records.escalation_outcome`): the request's answer
# (`a`: its last completed attempt, else its last cancelled one) climbed from a rung below.
_ROUTE_LABEL = (
    "CASE WHEN r.kind = 'auto' THEN 'auto:' || COALESCE(r.first_tier, r.any_tier, 'unknown') || "
    "CASE WHEN a.escalated_from IS NOT NULL THEN '→' || COALESCE(a.tier, a.model, 'unknown') ELSE '' END "
    "WHEN r.kind = 'cascade' AND r.answer_attempt IS NULL THEN 'cascade:failed' "
    "WHEN r.kind = 'cascade' AND a.escalated_from IS NOT NULL THEN 'cascade:escalated' "
    "WHEN r.kind = 'cascade' THEN 'cascade:accepted' ELSE r.kind END"
)


def day_bounds(start: dt.date, end: dt.date) -> tuple[float, float]:
    """The instants from the start of UTC day `start` to the end of UTC day `end` (exclusive)."""
    first = dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC)
    after = dt.datetime(end.year, end.month, end.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    return first.timestamp(), after.timestamp()


def summary_query(group_by: str | None, *, has_team: bool) -> tuple[str, bool]:
    """The usage summary's statement (`?` placeholders) and whether it reads the attempts (`usage`,
    bounded by two `started_at` instants) rather than the daily aggregate (bounded by two days).
    Both are then followed by the team, when `has_team`. Model, day and team come from the
    aggregate; key and route need each attempt (an aggregate has neither)."""
    check_group_by(group_by)
    if group_by in (None, "team", "model", "day"):
        # refused requests (no model: '') add nothing to the aggregate's sums, nor a row of their own
        where = "day BETWEEN ? AND ? AND model <> ''" + (" AND team = ?" if has_team else "")
        if group_by is None:
            return f"SELECT NULL, {_SUMS} FROM usage_daily WHERE {where}", False
        return f"SELECT {group_by}, {_SUMS} FROM usage_daily WHERE {where} GROUP BY 1 ORDER BY 1", False
    where = "started_at >= ? AND started_at < ? AND status <> 'refused'" + (" AND team = ?" if has_team else "")
    if group_by == "key":
        sql = f"SELECT key_id, {_ATTEMPT_SUMS} FROM usage WHERE {where} GROUP BY key_id ORDER BY key_id IS NULL, key_id"
        return sql, True
    per_request = (
        f"SELECT request_id, {_REQUEST_KIND} AS kind, MAX(CASE WHEN attempt = 1 THEN tier END) AS first_tier, "
        "MIN(CASE WHEN NOT is_shadow THEN tier END) AS any_tier, "
        "COALESCE(MAX(CASE WHEN status = 'completed' AND NOT is_shadow THEN attempt END), "
        "MAX(CASE WHEN status = 'cancelled' AND NOT is_shadow THEN attempt END)) AS answer_attempt, "
        f"{_ATTEMPT_SUMS} FROM usage WHERE {where} GROUP BY request_id"
    )
    labelled = (
        f"SELECT {_ROUTE_LABEL} AS route, r.cost_usd AS cost_usd, r.prompt_tokens AS prompt_tokens, "
        "r.completion_tokens AS completion_tokens, r.requests AS requests, r.batch_requests AS batch_requests, "
        "r.batch_cost_usd AS batch_cost_usd, r.shadow_cost_usd AS shadow_cost_usd, "
        "r.cache_read_tokens AS cache_read_tokens, r.cache_write_tokens AS cache_write_tokens, "
        "r.response_cache_hits AS response_cache_hits, r.response_cache_misses AS response_cache_misses, "
        "r.response_cache_bypasses AS response_cache_bypasses, r.response_cache_saved_usd AS response_cache_saved_usd "
        f"FROM ({per_request}) AS r "
        "LEFT JOIN usage AS a ON a.request_id = r.request_id AND a.attempt = r.answer_attempt"
    )
    return f"SELECT route, {_SUMS} FROM ({labelled}) AS labelled GROUP BY route ORDER BY route", True


_SUMMED = (
    "cost_usd",
    "prompt_tokens",
    "completion_tokens",
    "requests",
    "batch_requests",
    "batch_cost_usd",
    "shadow_cost_usd",
    "cache_read_tokens",
    "cache_write_tokens",
    "response_cache_hits",
    "response_cache_misses",
    "response_cache_bypasses",
    "response_cache_saved_usd",
)
_COSTS = ("cost_usd", "batch_cost_usd", "shadow_cost_usd", "response_cache_saved_usd")


def _group_value(group: Any) -> Any:
    if isinstance(group, dt.date):
        return group.isoformat()
    return None if group == "" else group


def _summary_row(group_by: str | None, row: tuple[Any, ...]) -> dict[str | None, Any]:
    group, cost, prompt, completion, requests, batch_requests, batch_cost, shadow_cost, cache_read, cache_write = row[
        :10
    ]
    hits, misses, bypasses, saved_usd = row[10:14]
    return {
        group_by: _group_value(group),
        "cost_usd": float(cost or 0.0),
        "prompt_tokens": int(prompt or 0),
        "completion_tokens": int(completion or 0),
        "requests": int(requests or 0),
        "batch_requests": int(batch_requests or 0),
        "batch_cost_usd": float(batch_cost or 0.0),
        "shadow_cost_usd": float(shadow_cost or 0.0),
        "cache_read_tokens": int(cache_read or 0),
        "cache_write_tokens": int(cache_write or 0),
        "response_cache_hits": int(hits or 0),
        "response_cache_misses": int(misses or 0),
        "response_cache_bypasses": int(bypasses or 0),
        "response_cache_saved_usd": float(saved_usd or 0.0),
    }


def summary(
    start: dt.date, end: dt.date, group_by: str | None, team: str | None, rows: list[tuple[Any, ...]]
) -> dict[str, Any]:
    """The usage summary's shape; `rows` are (group, cost_usd, prompt_tokens, completion_tokens,
    requests, batch_requests, batch_cost_usd, shadow_cost_usd, cache_read_tokens, cache_write_tokens,
    response_cache_hits, response_cache_misses, response_cache_bypasses, response_cache_saved_usd)
    (the prompt-cache tokens are among the prompt tokens). Costs are rounded as every output rounds USD
    (`round_usd`); the daily aggregate's "no team" ('') is shown as null."""
    data = [_summary_row(group_by, row) for row in rows]
    totals = {key: sum(row[key] for row in data) if data else (0.0 if key in _COSTS else 0) for key in _SUMMED}
    for key in _COSTS:
        totals[key] = round_usd(totals[key])
    for row in data:  # rounded once summed: the rows add up to the totals within a rounding
        for key in _COSTS:
            row[key] = round_usd(row[key])
    return {
        "object": "usage",
        "start_date": start.isoformat(),
        "end_date": end.isoformat(),
        "team": team,
        "group_by": group_by,
        **totals,
        "data": data if group_by is not None else [],
    }
