"""`/v1/usage` grouped by key, team, model, day or route, an open-ended period, money rounded;
`/admin/usage` and `/admin/report` for a team the directory or the ledger knows, a 404 for a typo.
The real proxy over a ledger written beforehand, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator

import httpx
import pytest

from switchyard.billing.records import UsageRecord
from switchyard.billing.store import open_database
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401

ADMIN = {"authorization": "Bearer sk-admin-groups"}
SEARCH = {"authorization": "Bearer sk-search"}
DAY = "2026-11-20"
T0 = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC).timestamp()


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
        key_id="key_search",
        requested_model="small",
        tier="small",
    )
    return UsageRecord(**(values | changes))


LEDGER = [
    attempt("s1"),
    attempt("s2", cost_usd=0.2, requested_model="auto"),  # 0.1 + 0.2: a float sum with noise
    attempt("a1", team="ads", key_id="key_ads", requested_model="cascade", status="escalated"),
    attempt(
        "a1",
        2,
        team="ads",
        key_id="key_ads",
        requested_model="cascade",
        model="large",
        tier="large",
        escalated_from="small",
    ),
    attempt("g1", team="gone", key_id="key_gone", cost_usd=0.05),  # a team removed from the config since
]


@pytest.fixture
def proxy_url(database_url: str) -> Iterator[str]:  # noqa: F811
    async def write() -> None:
        database = await open_database(database_url)
        try:
            await database.insert_usage(LEDGER)
        finally:
            await database.aclose()

    asyncio.run(write())
    settings = Settings(
        models=[{"name": "small", "base_url": "http://127.0.0.1:9/v1"}],
        teams={"search": {"api_keys": ["sk-search"]}, "ads": {"api_keys": ["sk-ads"]}},
        auth={"admin_key": "sk-admin-groups"},
        billing={"database_url": database_url, "ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url


def usage(url: str, headers: dict, path: str = "/v1/usage", **params: str) -> httpx.Response:
    return httpx.get(url + path, headers=headers, params={"start_date": DAY, "end_date": DAY} | params, timeout=30)


def test_a_key_the_directory_knows_is_shown_with_its_prefix(database_url: str) -> None:  # noqa: F811
    from switchyard.billing.teams import yaml_keys

    [known] = yaml_keys("search", ["sk-search-0123456789"])

    async def write() -> None:
        database = await open_database(database_url)
        try:
            await database.insert_usage([attempt("k1", key_id=known.id), attempt("k2", key_id="key_unknown")])
        finally:
            await database.aclose()

    asyncio.run(write())
    settings = Settings(
        models=[{"name": "small", "base_url": "http://127.0.0.1:9/v1"}],
        teams={"search": {"api_keys": ["sk-search-0123456789"]}},
        auth={"admin_key": "sk-admin-groups"},
        billing={"database_url": database_url, "ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        rows = usage(url, ADMIN, group_by="key").json()["data"]
    assert {row["key"]: row["key_prefix"] for row in rows} == {known.id: known.prefix, "key_unknown": None}
    assert known.prefix.startswith("sk-sear") and "0123456789" not in known.prefix


def test_every_group_for_the_admin_and_a_teams_own_rows(proxy_url: str) -> None:
    by_key = usage(proxy_url, ADMIN, group_by="key").json()
    assert [(row["key"], row["requests"], row["cost_usd"]) for row in by_key["data"]] == [
        ("key_ads", 1, 0.2),
        ("key_gone", 1, 0.05),
        ("key_search", 2, 0.3),  # 0.30000000000000004 summed, 0.3 shown
    ]
    assert (by_key["cost_usd"], by_key["requests"], by_key["group_by"]) == (0.55, 4, "key")
    by_team = usage(proxy_url, ADMIN, group_by="team").json()
    assert {row["team"]: row["cost_usd"] for row in by_team["data"]} == {"ads": 0.2, "gone": 0.05, "search": 0.3}
    by_route = usage(proxy_url, ADMIN, group_by="route").json()
    assert {row["route"]: row["requests"] for row in by_route["data"]} == {
        "auto:small": 1,
        "cascade:escalated": 1,
        "direct": 2,
    }
    own = usage(proxy_url, SEARCH, group_by="team").json()
    assert (own["team"], [row["team"] for row in own["data"]]) == ("search", ["search"])
    own_keys = usage(proxy_url, SEARCH, group_by="key").json()
    assert [row["key"] for row in own_keys["data"]] == ["key_search"]
    # a key the directory knows is shown with its prefix too; one it does not (the ledger's) without
    assert [row["key_prefix"] for row in by_key["data"]] == [None, None, None]
    for group in ("model", "day"):  # the groups there were before, in the same shape
        rows = usage(proxy_url, SEARCH, group_by=group).json()["data"]
        assert list(rows[0]) == [group, "cost_usd", "prompt_tokens", "completion_tokens", "requests"] + [
            "batch_requests",
            "batch_cost_usd",
            "shadow_cost_usd",
            "cache_read_tokens",
            "cache_write_tokens",
            "response_cache_hits",
            "response_cache_misses",
            "response_cache_bypasses",
            "response_cache_saved_usd",
        ]


def test_a_bad_group_names_the_allowed_ones(proxy_url: str) -> None:
    bad = usage(proxy_url, SEARCH, group_by="week")
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["param"], error["type"]) == ("group_by", "invalid_request_error")
    assert error["message"] == "group_by must be one of key, team, model, day, route, not 'week'."


def test_either_end_of_the_period_may_be_left_open(proxy_url: str) -> None:
    today = dt.datetime.now(dt.UTC).date()
    start_only = httpx.get(proxy_url + "/v1/usage", headers=SEARCH, params={"start_date": DAY})
    assert start_only.status_code == 200, start_only.text
    body = start_only.json()
    assert (body["start_date"], body["end_date"]) == (DAY, max(today, dt.date(2026, 11, 20)).isoformat())
    assert body["requests"] == 2
    end_only = httpx.get(proxy_url + "/v1/usage", headers=SEARCH, params={"end_date": DAY})
    assert end_only.status_code == 200, end_only.text
    assert (end_only.json()["start_date"], end_only.json()["requests"]) == ("2026-11-01", 2)
    backwards = usage(proxy_url, SEARCH, start_date="2026-11-21", end_date="2026-11-20")
    assert backwards.status_code == 400
    assert backwards.json()["error"]["message"] == "end_date 2026-11-20 is before start_date 2026-11-21."


def test_a_team_known_to_the_directory_or_the_ledger_is_reported_and_a_typo_is_a_404(proxy_url: str) -> None:
    gone = usage(proxy_url, ADMIN, "/admin/usage", team="gone")
    assert gone.status_code == 200 and gone.json()["cost_usd"] == 0.05
    page = httpx.get(proxy_url + "/admin/report", headers=ADMIN, params={"team": "gone"}, timeout=60)
    assert page.status_code == 200 and "<dd>gone</dd>" in page.text
    for path in ("/admin/usage", "/admin/report", "/v1/usage", "/v1/usage/report"):
        typo = httpx.get(proxy_url + path, headers=ADMIN, params={"team": "serach"}, timeout=60)
        assert typo.status_code == 404, (path, typo.text)
        error = typo.json()["error"]
        assert (error["param"], error["code"]) == ("team", "not_found")
        assert error["message"] == "No team 'serach' in the teams or in the ledger; known teams: ads, gone, search."
