"""A database written before the cascade's confidence and the client's times were kept gains their
columns when it is opened, on SQLite and PostgreSQL alike; its rows stay, with those fields empty."""

from __future__ import annotations

import datetime as dt

import pytest

from switchyard.billing.store import migrations, open_database
from switchyard.billing.store.schema import USAGE_COLUMNS, usage_values
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401
from tests.unit.billing.test_store import usage

NEW_COLUMNS = ("confidence", "threshold", "request_ttfb_ms", "request_duration_ms")
# added by later migrations than those under test here
LATER_COLUMNS = ("routing_version", "cache_read_tokens", "cache_write_tokens", *migrations.USAGE_ADDED_7)


async def test_an_old_database_gains_the_columns_and_keeps_its_rows(
    database_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert migrations.USAGE_ADDED_3 == NEW_COLUMNS
    with monkeypatch.context() as before:  # the schema as it was: the first two migrations
        before.setattr(migrations, "SQLITE", migrations.SQLITE[:2])
        before.setattr(migrations, "POSTGRES", migrations.POSTGRES[:2])
        old = await open_database(database_url)
        old_columns = [c for c in USAGE_COLUMNS if c not in NEW_COLUMNS + LATER_COLUMNS]
        record = usage("old", requested_model="cascade", escalated_from="small")
        values = dict(zip(USAGE_COLUMNS, usage_values(record), strict=True))
        placeholders = ", ".join("?" for _ in old_columns)
        await old.execute(
            f"INSERT INTO usage ({', '.join(old_columns)}) VALUES ({placeholders})", *(values[c] for c in old_columns)
        )
        await old.aclose()

    database = await open_database(database_url)
    try:
        assert await database.read_usage(request_id="old") == [record]  # the new fields empty
        judged = usage("new", confidence=-1.5, threshold=-0.8, request_ttfb_ms=40.0, request_duration_ms=95.5)
        assert await database.insert_usage([judged]) == 1
        assert await database.read_usage(request_id="new") == [judged]
        versions = await database.fetch("SELECT version FROM schema_migrations ORDER BY version")
        num_migrations = len(migrations.SQLITE if database_url.startswith("sqlite") else migrations.POSTGRES)
        assert [v for (v,) in versions] == list(range(1, num_migrations + 1))
    finally:
        await database.aclose()
    again = await open_database(database_url)  # a second start migrates nothing
    assert len(await again.read_usage()) == 2
    await again.aclose()


async def test_an_old_database_gains_the_routing_version(
    database_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows from before the routing version was kept read back without one; new rows keep it."""
    with monkeypatch.context() as before:
        before.setattr(migrations, "SQLITE", migrations.SQLITE[:3])
        before.setattr(migrations, "POSTGRES", migrations.POSTGRES[:3])
        old = await open_database(database_url)
        old_columns = [c for c in USAGE_COLUMNS if c not in LATER_COLUMNS]
        record = usage("old", requested_model="auto")
        values = dict(zip(USAGE_COLUMNS, usage_values(record), strict=True))
        placeholders = ", ".join("?" for _ in old_columns)
        await old.execute(
            f"INSERT INTO usage ({', '.join(old_columns)}) VALUES ({placeholders})", *(values[c] for c in old_columns)
        )
        await old.aclose()
    database = await open_database(database_url)
    try:
        assert await database.read_usage(request_id="old") == [record]
        routed = usage("new", requested_model="auto", routing_version="v-0123456789ab")
        assert await database.insert_usage([routed]) == 1
        assert (await database.read_usage(request_id="new"))[0].routing_version == "v-0123456789ab"
    finally:
        await database.aclose()


async def test_an_old_database_gains_the_cache_token_columns_and_sums(
    database_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows from before prompt-cache tokens were kept read back without them and add nothing to the
    summary's cache sums; new rows are summed into the daily aggregate the old rows are in."""
    assert migrations.USAGE_ADDED_6 == ("cache_read_tokens", "cache_write_tokens")
    with monkeypatch.context() as before:
        before.setattr(migrations, "SQLITE", migrations.SQLITE[:5])
        before.setattr(migrations, "POSTGRES", migrations.POSTGRES[:5])
        old = await open_database(database_url)
        old_columns = [c for c in USAGE_COLUMNS if c not in (*migrations.USAGE_ADDED_6, *migrations.USAGE_ADDED_7)]
        record = usage("old", prompt_tokens=100)
        values = dict(zip(USAGE_COLUMNS, usage_values(record), strict=True))
        placeholders = ", ".join("?" for _ in old_columns)
        await old.execute(
            f"INSERT INTO usage ({', '.join(old_columns)}) VALUES ({placeholders})", *(values[c] for c in old_columns)
        )
        await old.aclose()
    database = await open_database(database_url)
    try:
        assert await database.read_usage(request_id="old") == [record]
        assert record.cache_read_tokens is None and record.cache_write_tokens is None
        cached = usage("new", prompt_tokens=2060, cache_read_tokens=2048, cache_write_tokens=0)
        written = usage("newer", prompt_tokens=2060, cache_read_tokens=0, cache_write_tokens=2048)
        assert await database.insert_usage([cached, written]) == 2
        assert await database.read_usage(request_id="new") == [cached]
        day = dt.datetime.fromtimestamp(record.started_at, dt.UTC).date()
        summary = await database.usage_summary(day, day, group_by="model", team=None)
        assert (summary["prompt_tokens"], summary["cache_read_tokens"], summary["cache_write_tokens"]) == (
            4220,
            2048,
            2048,
        )
        by_key = await database.usage_summary(day, day, group_by="key", team=None)  # read from the attempts
        assert (by_key["cache_read_tokens"], by_key["cache_write_tokens"]) == (2048, 2048)
    finally:
        await database.aclose()


async def test_an_old_database_gains_the_response_cache_columns_and_sums(
    database_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows from before the response cache read back without its fields and add nothing to its
    sums; a hit, a miss and a bypass written after are counted into the daily aggregate."""
    with monkeypatch.context() as before:
        before.setattr(migrations, "SQLITE", migrations.SQLITE[:6])
        before.setattr(migrations, "POSTGRES", migrations.POSTGRES[:6])
        old = await open_database(database_url)
        old_columns = [c for c in USAGE_COLUMNS if c not in migrations.USAGE_ADDED_7]
        record = usage("old", prompt_tokens=100)
        values = dict(zip(USAGE_COLUMNS, usage_values(record), strict=True))
        placeholders = ", ".join("?" for _ in old_columns)
        await old.execute(
            f"INSERT INTO usage ({', '.join(old_columns)}) VALUES ({placeholders})", *(values[c] for c in old_columns)
        )
        await old.aclose()
    database = await open_database(database_url)
    try:
        assert await database.read_usage(request_id="old") == [record]
        hit = usage(
            "hit",
            prompt_tokens=0,
            completion_tokens=0,
            cost_usd=0.0,
            response_cache="hit",
            response_cache_saved_tokens=15,
            response_cache_saved_usd=0.25,
        )
        missed, bypassed = usage("miss", response_cache="miss"), usage("bypass", response_cache="bypass")
        assert await database.insert_usage([hit, missed, bypassed]) == 3
        assert await database.read_usage(request_id="hit") == [hit]
        day = dt.datetime.fromtimestamp(record.started_at, dt.UTC).date()
        for group_by in ("model", "key"):  # the daily aggregate, and the attempts
            summary = await database.usage_summary(day, day, group_by=group_by, team=None)
            counts = [summary[f"response_cache_{k}"] for k in ("hits", "misses", "bypasses", "saved_usd")]
            assert counts == [1, 1, 1, pytest.approx(0.25)], group_by
    finally:
        await database.aclose()
