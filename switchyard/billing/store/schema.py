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
GROUP_BY = (None, "model", "day")


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
        raise ValueError(f"group_by must be 'model' or 'day', not {group_by!r}")


def summary(
    start: dt.date, end: dt.date, group_by: str | None, team: str | None, rows: list[tuple[Any, ...]]
) -> dict[str, Any]:
    """The usage summary's shape; `rows` are (group, cost_usd, prompt_tokens, completion_tokens,
    requests, batch_requests, batch_cost_usd). Costs are rounded to 10 decimals (sums of floats)."""
    data: list[dict[str | None, Any]] = [
        {
            group_by: group.isoformat() if isinstance(group, dt.date) else group,
            "cost_usd": round(float(cost or 0.0), 10),
            "prompt_tokens": int(prompt or 0),
            "completion_tokens": int(completion or 0),
            "requests": int(requests or 0),
            "batch_requests": int(batch_requests or 0),
            "batch_cost_usd": round(float(batch_cost or 0.0), 10),
        }
        for group, cost, prompt, completion, requests, batch_requests, batch_cost in rows
    ]
    totals = {
        key: round(sum(row[key] for row in data), 10) if data else (0.0 if key.endswith("cost_usd") else 0)
        for key in ("cost_usd", "prompt_tokens", "completion_tokens", "requests", "batch_requests", "batch_cost_usd")
    }
    return {
        "object": "usage",
        "start_date": start.isoformat(),
        "end_date": end.isoformat(),
        "team": team,
        "group_by": group_by,
        **totals,
        "data": data if group_by is not None else [],
    }
