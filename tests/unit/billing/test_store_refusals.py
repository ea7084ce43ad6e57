"""Refused requests in the ledger, on SQLite and PostgreSQL alike: one record each, and nothing
in the usage summary (no request, token or cost, no row of any group)."""

from __future__ import annotations

from switchyard.billing.refusals import refusal_record
from switchyard.billing.store import open_database
from switchyard.billing.store.schema import GROUP_BY
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401
from tests.unit.billing.test_store_usage_groups import DAY, LEDGER, T0

REFUSALS = [
    refusal_record(
        request_id=f"refused-{n}",
        reason=reason,
        started_at=T0 + 60 * n,
        duration_ms=0.4,
        team=team,
        key_id=key_id,
        requested_model="auto",
    )
    for n, (reason, team, key_id) in enumerate(
        [("budget", "search", "key_a"), ("rate_limit", "search", "key_a"), ("invalid_json", "gone", "key_g")]
    )
]


async def test_refusals_are_kept_and_change_no_usage_summary(database_url: str) -> None:  # noqa: F811
    database = await open_database(database_url)
    try:
        await database.insert_usage(LEDGER)
        before = {group: await database.usage_summary(DAY, DAY, group_by=group, team=None) for group in GROUP_BY}
        search = await database.usage_summary(DAY, DAY, group_by="model", team="search")
        assert await database.insert_usage(REFUSALS) == 3
        assert await database.insert_usage(REFUSALS) == 0  # once each, however often written
        after = {group: await database.usage_summary(DAY, DAY, group_by=group, team=None) for group in GROUP_BY}
        kept = await database.read_usage(request_id="refused-2")
        assert await database.usage_summary(DAY, DAY, group_by="model", team="search") == search
        assert await database.usage_summary(DAY, DAY, group_by=None, team="gone") == {
            "object": "usage",
            "start_date": DAY.isoformat(),
            "end_date": DAY.isoformat(),
            "team": "gone",
            "group_by": None,
            "cost_usd": 0.0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "requests": 0,
            "batch_requests": 0,
            "batch_cost_usd": 0.0,
            "shadow_cost_usd": 0.0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "response_cache_hits": 0,
            "response_cache_misses": 0,
            "response_cache_bypasses": 0,
            "response_cache_saved_usd": 0.0,
            "data": [],
        }
        spent = await database.spend_since(T0 - 1)
    finally:
        await database.aclose()
    assert after == before
    assert [(r.status, r.attempt, r.model, r.error, r.team, r.cost_usd) for r in kept] == [
        ("refused", 0, "", "invalid_json", "gone", 0.0)
    ]
    assert spent.get(("team", "gone"), 0.0) == 0.0
