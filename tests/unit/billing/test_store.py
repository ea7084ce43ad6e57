"""The database, on SQLite and PostgreSQL alike: the ledger's rows, the daily aggregate, teams and keys."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import pytest

from switchyard.billing.records import UsageRecord
from switchyard.billing.store import (
    Database,
    StoreConflict,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    open_database,
)
from switchyard.billing.store.base import sqlite_path
from switchyard.billing.teams import Team, digest
from switchyard.core.urls import mask_password
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401

DAY1 = dt.datetime(2026, 11, 20, 23, 59, 59, tzinfo=dt.UTC).timestamp()
DAY2 = DAY1 + 2  # 2026-11-21 00:00:01 UTC


def usage(request_id: str, attempt: int = 1, **changes) -> UsageRecord:
    values = dict(
        request_id=request_id,
        attempt=attempt,
        model="small",
        backend="fake",
        status="completed",
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=0.25,
        is_estimated=False,
        started_at=DAY1,
        duration_ms=12.5,
        team="search",
    )
    return UsageRecord(**(values | changes))


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:  # noqa: F811
    database = await open_database(database_url)
    yield database
    await database.aclose()


async def test_every_field_survives_the_round_trip(database: Database) -> None:
    record = usage(
        "r1",
        error="boom",
        client_request_id="client-1",
        key_id="key_ab",
        requested_model="auto",
        tier="small",
        route="auto:score=0.31",
        score=0.31,
        escalated_from="tiny",
        ttft_ms=40.5,
        is_hedge=True,
        is_shadow=True,
        hosting="self-hosted",
        ceiling_cost_usd=1.5,
        is_estimated=True,
        confidence=-1.25,
        threshold=-0.8,
        request_ttfb_ms=55.5,
        request_duration_ms=120.25,
        cache_read_tokens=6,
        cache_write_tokens=3,
    )
    assert await database.insert_usage([record]) == 1
    assert await database.read_usage(request_id="r1") == [record]
    assert await database.read_usage(client_request_id="client-1") == [record]
    assert await database.read_usage(client_request_id="nobody") == []


async def test_an_existing_row_is_kept_never_replaced(database: Database) -> None:
    first = [usage("r1"), usage("r1", 2), usage("r2")]
    assert await database.insert_usage(first) == 3
    intruder = usage("r1", team="other", cost_usd=9.0)
    assert await database.insert_usage([intruder, usage("r3")]) == 1
    assert await database.read_usage(request_id="r1") == first[:2]
    whole = await database.usage_summary(dt.date(2026, 11, 20), dt.date(2026, 11, 20), group_by=None, team=None)
    assert (whole["requests"], whole["cost_usd"]) == (3, pytest.approx(1.0))  # r1, r2, r3; 4 attempts


async def test_spend_since_counts_teams_and_keys_from_the_given_instant(database: Database) -> None:
    await database.insert_usage(
        [
            usage("early", started_at=DAY1 - 1, key_id="key_a"),
            usage("a", started_at=DAY1, key_id="key_a"),
            usage("b", started_at=DAY2, key_id="key_b", team="ads", cost_usd=0.5),
            usage("anon", started_at=DAY2, team=None),
            usage("a", 1001, started_at=DAY1, key_id="key_a", cost_usd=9.0, is_shadow=True),  # the platform pays
        ]
    )
    assert await database.spend_since(DAY1) == {
        ("team", "search"): pytest.approx(0.25),
        ("team", "ads"): pytest.approx(0.5),
        ("key", "key_a"): pytest.approx(0.25),
        ("key", "key_b"): pytest.approx(0.5),
    }


async def test_the_summary_reads_utc_days_inclusively_by_model_or_day(database: Database) -> None:
    await database.insert_usage(
        [
            usage("a", 1, started_at=DAY1),
            usage(
                "a",
                2,
                started_at=DAY1,
                model="large",
                cost_usd=1.0,
                prompt_tokens=100,
                completion_tokens=50,
                cache_read_tokens=60,
                cache_write_tokens=30,
            ),
            usage("b", started_at=DAY2, model="large", cost_usd=1.0, batch_id="batch_1", cache_read_tokens=4),
            usage("c", started_at=DAY2, team="ads", cost_usd=4.0),
            usage("d", started_at=DAY2 + 86_400, cost_usd=8.0),  # 2026-11-22: outside
            # a shadow call: the platform pays, its cost kept apart
            usage(
                "a",
                1001,
                started_at=DAY1,
                model="large",
                cost_usd=0.5,
                is_shadow=True,
                prompt_tokens=0,
                completion_tokens=0,
            ),
        ]
    )
    start, end = dt.date(2026, 11, 20), dt.date(2026, 11, 21)
    by_model = await database.usage_summary(start, end, group_by="model", team="search")
    assert by_model == {
        "object": "usage",
        "start_date": "2026-11-20",
        "end_date": "2026-11-21",
        "team": "search",
        "group_by": "model",
        "cost_usd": pytest.approx(2.25),
        "prompt_tokens": 120,
        "completion_tokens": 60,
        "requests": 2,  # a (two attempts) and b
        "batch_requests": 1,
        "batch_cost_usd": pytest.approx(1.0),
        "shadow_cost_usd": pytest.approx(0.5),
        "cache_read_tokens": 64,  # among the prompt tokens
        "cache_write_tokens": 30,
        "response_cache_hits": 0,
        "response_cache_misses": 0,
        "response_cache_bypasses": 0,
        "response_cache_saved_usd": 0.0,
        "data": [
            {
                "model": "large",
                "cost_usd": pytest.approx(2.0),
                "prompt_tokens": 110,
                "completion_tokens": 55,
                "requests": 1,
                "batch_requests": 1,
                "batch_cost_usd": pytest.approx(1.0),
                "shadow_cost_usd": pytest.approx(0.5),
                "cache_read_tokens": 64,
                "cache_write_tokens": 30,
                "response_cache_hits": 0,
                "response_cache_misses": 0,
                "response_cache_bypasses": 0,
                "response_cache_saved_usd": 0.0,
            },
            {
                "model": "small",
                "cost_usd": pytest.approx(0.25),
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "requests": 1,
                "batch_requests": 0,
                "batch_cost_usd": 0.0,
                "shadow_cost_usd": 0.0,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
                "response_cache_hits": 0,
                "response_cache_misses": 0,
                "response_cache_bypasses": 0,
                "response_cache_saved_usd": 0.0,
            },
        ],
    }
    by_day = await database.usage_summary(start, end, group_by="day", team=None)
    assert [(row["day"], row["cost_usd"], row["requests"]) for row in by_day["data"]] == [
        ("2026-11-20", pytest.approx(1.25), 1),
        ("2026-11-21", pytest.approx(5.0), 2),
    ]
    assert by_day["cost_usd"] == pytest.approx(6.25)
    empty = await database.usage_summary(dt.date(2026, 1, 1), dt.date(2026, 1, 2), group_by=None, team=None)
    assert (empty["cost_usd"], empty["requests"], empty["data"]) == (0.0, 0, [])
    with pytest.raises(ValueError, match="group_by"):
        await database.usage_summary(start, end, group_by="team; DROP TABLE usage", team=None)


async def test_iter_usage_pages_through_every_row_in_order(database: Database) -> None:
    records = [usage(f"r{i:02}", started_at=DAY1 + i // 3, team="ads" if i % 4 == 0 else "search") for i in range(23)]
    await database.insert_usage(list(reversed(records)))
    batches = [batch async for batch in database.iter_usage(None, None, None, batch_size=5)]
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    assert [r for batch in batches for r in batch] == records
    since, until = DAY1 + 2, DAY1 + 6
    expected = [r for r in records if since <= r.started_at < until and r.team == "search"]
    assert await database.count_usage(since, until, "search") == len(expected) > 0
    assert [r async for batch in database.iter_usage(since, until, "search", batch_size=2) for r in batch] == expected
    assert await database.count_usage(None, None, None) == 23


async def test_teams_are_created_updated_and_listed_and_each_write_bumps_the_version(database: Database) -> None:
    assert await database.directory_version() == 0
    await database.create_team(Team("search", frozenset({"small", "large"}), 1.0, 20.0, 60, 10_000, "batch"))
    await database.create_team(Team("ads"))
    with pytest.raises(StoreConflict, match="search"):
        await database.create_team(Team("search"))
    updated = await database.update_team("search", models=["small"], rpm=None, priority="interactive")
    assert updated == Team("search", frozenset({"small"}), 1.0, 20.0, None, 10_000, "interactive", source="database")
    with pytest.raises(StoreNotFound):
        await database.update_team("nobody", rpm=1)
    with pytest.raises(ValueError, match="colour"):
        await database.update_team("ads", colour="red")
    assert await database.list_teams() == [Team("ads", source="database"), updated]
    assert await database.directory_version() == 3


async def test_keys_are_stored_as_digests_shown_once_and_revoked(database: Database) -> None:
    key, api_key = await database.create_key("search", budget_usd_per_day=0.5, rpm=10, expires_at=DAY2)
    assert key.startswith("sk-") and api_key.id.startswith("key_") and key.startswith(api_key.prefix.rstrip("…"))
    assert api_key.digest == digest(key) and api_key.is_usable(DAY1) and not api_key.is_usable(DAY2)
    other_key, other = await database.create_key("ads")
    assert other_key != key
    teams, keys = await database.load_directory()
    assert teams == [] and keys == [api_key, other]
    assert await database.list_keys("ads") == [other]
    revoked = await database.revoke_key(api_key.id)
    assert revoked.revoked_at is not None and not revoked.is_usable(DAY1)
    assert (await database.revoke_key(api_key.id)).revoked_at == revoked.revoked_at  # the first revocation stands
    with pytest.raises(StoreNotFound):
        await database.revoke_key("key_nope")
    assert await database.directory_version() == 4


async def test_migrations_run_once_even_when_two_processes_open_together(database_url: str) -> None:  # noqa: F811
    first, second = await asyncio.gather(open_database(database_url), open_database(database_url))
    await first.insert_usage([usage("r1")])
    await first.aclose()
    await second.aclose()
    again = await open_database(database_url)
    assert await again.read_usage(request_id="r1") == [usage("r1")]
    await again.aclose()


def test_urls_name_the_file_and_never_show_a_password(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sqlite_path("sqlite:///data/usage.db").as_posix() == "data/usage.db"
    assert sqlite_path("sqlite:////var/lib/usage.db").as_posix() == "/var/lib/usage.db"
    assert sqlite_path("sqlite:///~/usage.db") == tmp_path / "usage.db"
    assert mask_password("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask_password("postgresql://me@db/x") == "postgresql://me@db/x"


async def test_an_unknown_url_is_refused() -> None:
    with pytest.raises(StoreError, match="unknown database url 'mysql://me:\\*\\*\\*@db/x'"):
        await open_database("mysql://me:pw@db/x")


async def test_a_postgres_nobody_listens_on_is_unavailable(unused_tcp_port: int) -> None:
    with pytest.raises(StoreUnavailable, match=r"postgresql://me:\*\*\*@127.0.0.1"):
        await open_database(f"postgresql://me:pw@127.0.0.1:{unused_tcp_port}/x", command_timeout_s=1.0)
