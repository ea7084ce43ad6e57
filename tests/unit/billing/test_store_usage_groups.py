"""The usage summary's groups (key, team, model, day, route) and the ledger's teams, on SQLite and
PostgreSQL alike: one shape for every group, the same numbers from both databases."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterable

import pytest

from switchyard.billing.records import UsageRecord
from switchyard.billing.report import build_report
from switchyard.billing.store import Database, open_database
from switchyard.billing.store.schema import GROUP_BY
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401

DAY = dt.date(2026, 11, 20)
T0 = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC).timestamp()
ROW_KEYS = [
    "cost_usd",
    "prompt_tokens",
    "completion_tokens",
    "requests",
    "batch_requests",
    "batch_cost_usd",
    "shadow_cost_usd",
    "cache_read_tokens",
    "cache_write_tokens",
]
RESPONSE_CACHE_KEYS = [
    "response_cache_hits",
    "response_cache_misses",
    "response_cache_bypasses",
    "response_cache_saved_usd",
]


def attempt(request_id: str, number: int = 1, **changes) -> UsageRecord:
    values = dict(
        request_id=request_id,
        attempt=number,
        model="small",
        backend="openai#0",
        status="completed",
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=0.1,
        is_estimated=False,
        started_at=T0 + number,
        duration_ms=12.5,
        team="search",
        key_id="key_a",
        tier="small",
    )
    return UsageRecord(**(values | changes))


LEDGER = [
    # auto, answered by the small tier
    attempt("r1", requested_model="auto", route="auto:classifier=0.20<0.45->small"),
    # the cascade escalated from small to large: one request, two attempts
    attempt("r2", requested_model="cascade", status="escalated", route="cascade->small"),
    attempt(
        "r2",
        2,
        requested_model="cascade",
        model="large",
        tier="large",
        cost_usd=0.4,
        escalated_from="small",
        cache_read_tokens=4,
    ),
    # the cascade accepted its first rung, for another key of another team
    attempt("r3", requested_model="cascade", team="ads", key_id="key_b"),
    # a model named directly, a batch's line
    attempt(
        "r4",
        requested_model="large",
        model="large",
        tier="large",
        cost_usd=0.2,
        batch_id="batch_1",
        cache_write_tokens=2,
    ),
    # before the ledger kept what was asked for: no key, no team, no route
    attempt("r5", key_id=None, team=None, tier=None),
    # the next day: outside a one-day period
    attempt("r6", requested_model="auto", started_at=T0 + 86_400),
]


async def _one_batch(records: Iterable[UsageRecord]):
    yield list(records)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:  # noqa: F811
    database = await open_database(database_url)
    await database.insert_usage(LEDGER)
    yield database
    await database.aclose()


def rows(summary: dict, group: str) -> dict:
    return {row[group]: tuple(row[k] for k in ROW_KEYS) for row in summary["data"]}


async def test_every_group_has_the_same_shape_and_adds_up_to_the_totals(database: Database) -> None:
    totals = await database.usage_summary(DAY, DAY, group_by=None, team=None)
    assert (totals["requests"], totals["cost_usd"], totals["batch_requests"]) == (5, 1.0, 1)
    assert (totals["cache_read_tokens"], totals["cache_write_tokens"]) == (4, 2)
    for group in GROUP_BY[1:]:
        summary = await database.usage_summary(DAY, DAY, group_by=group, team=None)
        assert summary["group_by"] == group
        assert {k: summary[k] for k in ROW_KEYS} == {k: totals[k] for k in ROW_KEYS}, group
        for row in summary["data"]:
            assert list(row) == [group, *ROW_KEYS, *RESPONSE_CACHE_KEYS]
        assert sum(row["requests"] for row in summary["data"]) == 5


async def test_by_key_and_by_team(database: Database) -> None:
    by_key = await database.usage_summary(DAY, DAY, group_by="key", team=None)
    assert list(rows(by_key, "key").items()) == [
        ("key_a", (0.8, 40, 20, 3, 1, 0.2, 0.0, 4, 2)),
        ("key_b", (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0)),
        (None, (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0)),  # no key: last
    ]
    by_team = await database.usage_summary(DAY, DAY, group_by="team", team=None)
    assert rows(by_team, "team") == {
        None: (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
        "ads": (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
        "search": (0.8, 40, 20, 3, 1, 0.2, 0.0, 4, 2),
    }
    own = await database.usage_summary(DAY, DAY, group_by="team", team="search")
    assert list(rows(own, "team")) == ["search"]  # a team reads its own row only


ROUTED = [
    # auto routed small, judged and climbed to large: `auto:small→large`
    attempt("r7", requested_model="auto", status="escalated", route="auto:classifier=0.30<0.45->small"),
    attempt("r7", 2, requested_model="auto", model="large", tier="large", escalated_from="small"),
    # a cascade that nothing answered
    attempt("r8", requested_model="cascade", status="failed", error="upstream_error"),
]


async def test_by_route_names_requests_as_the_reports_route_mix(database: Database) -> None:
    await database.insert_usage(ROUTED)
    by_route = await database.usage_summary(DAY, DAY, group_by="route", team=None)
    assert rows(by_route, "route") == {
        "auto:small": (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
        "auto:small→large": (0.2, 20, 10, 1, 0, 0.0, 0.0, 0, 0),
        "cascade:accepted": (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
        "cascade:escalated": (0.5, 20, 10, 1, 0, 0.0, 0.0, 4, 0),  # both attempts
        "cascade:failed": (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
        "direct": (0.2, 10, 5, 1, 1, 0.2, 0.0, 0, 2),
        "unrecorded": (0.1, 10, 5, 1, 0, 0.0, 0.0, 0, 0),
    }
    # the same names and counts as the report's route mix, read from the same ledger
    one_day = [r for r in LEDGER + ROUTED if r.started_at < T0 + 86_400]
    report = await build_report(_one_batch(one_day), since=DAY, until=DAY)
    assert report.summary["route_mix"] == {route: values[3] for route, values in rows(by_route, "route").items()}
    two_days = await database.usage_summary(DAY, DAY + dt.timedelta(days=1), group_by="route", team="search")
    assert rows(two_days, "route")["auto:small"][3] == 2


async def test_costs_are_rounded_to_whole_hundred_millionths(database: Database) -> None:
    await database.insert_usage([attempt(f"tiny{i}", cost_usd=0.1 / 3) for i in range(3)])
    summary = await database.usage_summary(DAY, DAY, group_by="model", team="search")
    assert summary["cost_usd"] == 0.9 and rows(summary, "model")["small"][0] == 0.3


async def test_the_ledgers_teams(database: Database) -> None:
    assert await database.usage_teams() == ["ads", "search"]


async def test_an_unknown_group_names_the_allowed_ones(database: Database) -> None:
    with pytest.raises(ValueError, match="group_by must be one of key, team, model, day, route, not 'week'"):
        await database.usage_summary(DAY, DAY, group_by="week", team=None)
