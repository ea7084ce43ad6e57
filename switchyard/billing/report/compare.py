"""The previous period beside the report's: as many days, ending the day before it starts.

Only a bounded period (a first and a last day) has one; the summary then holds the previous
period's headline numbers (`previous`) and how each moved (`change`: absolute, and in percent of
the previous value, None when that was zero).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

COMPARED = (
    "cost_usd",
    "requests",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "savings_usd",
    "cascade_escalation_rate",
    "auto_escalation_rate",
)


def previous_period(since: date | None, until: date | None) -> tuple[date, date] | None:
    """The days just before since..until, as many of them; None when either end is open or the
    previous period would start before the calendar does (year 1)."""
    if since is None or until is None or until < since:
        return None
    num_days = (until - since).days + 1
    if (since - date.min).days < num_days:
        return None
    return since - timedelta(days=num_days), since - timedelta(days=1)


def headline(summary: Mapping[str, Any]) -> dict[str, float | int | None]:
    """The compared numbers of one period's summary (`tables.build_summary`)."""
    return {
        "cost_usd": summary["cost_usd"],
        "requests": summary["requests"],
        "attempts": summary["attempts"],
        "prompt_tokens": summary["prompt_tokens"],
        "completion_tokens": summary["completion_tokens"],
        "savings_usd": summary["savings"]["savings_usd"],
        "cascade_escalation_rate": summary["escalation"]["cascade"]["rate"],
        "auto_escalation_rate": summary["escalation"]["auto"]["rate"],
    }


def compare_periods(
    current: Mapping[str, Any], previous: Mapping[str, Any], since: date, until: date
) -> tuple[dict[str, Any], dict[str, dict[str, float | None]]]:
    """(`previous`, `change`) for the summary: the previous period (since..until) and each number's move."""
    now, before = headline(current), headline(previous)
    block = {"since": since.isoformat(), "until": until.isoformat(), "records": previous["records"], **before}
    return block, {name: change(now[name], before[name]) for name in COMPARED}


def change(now: float | None, before: float | None) -> dict[str, float | None]:
    if now is None or before is None:
        return {"absolute": None, "pct": None}
    absolute = now - before
    return {"absolute": absolute, "pct": 100 * absolute / before if before else None}
