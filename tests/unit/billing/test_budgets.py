"""A caller's budgets over a limiter: the refusals they explain, and settling that outlasts an outage."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid

import pytest

from switchyard.billing.budgets import RETRY_AFTER_CAP_S, Budgets, budget_scopes, start_of_utc_day
from switchyard.billing.limits import LocalLimiter, ValkeyLimiter
from switchyard.billing.teams import ApiKey, Principal, Team
from switchyard.core.errors import LimitsUnavailable
from tests.fakes.clock import ManualClock


def principal(team_day: float | None = None, key_day: float | None = None) -> Principal:
    return Principal(
        Team("research", budget_usd_per_day=team_day),
        ApiKey("key_abc", "research", "sk-sy-abcdef…", b"d" * 32, budget_usd_per_day=key_day),
    )


async def test_a_request_bigger_than_a_whole_budget_can_never_fit_and_says_not_to_retry():
    budgets = Budgets(LocalLimiter())
    caller = principal(team_day=10, key_day=0.01)
    spending = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert not await spending.reserve(0.02)
    refusal = await budgets.refusal(caller, (0.02, "m-large"))
    assert "more than the whole budget of API key key_abc (sk-sy-abcdef…) for a day ($0.01)" in refusal.message
    assert "it can never fit" in refusal.message
    assert refusal.headers() == {"x-should-retry": "false"}  # no Retry-After: waiting does not help
    assert await spending.reserve(0.01)
    spending.charge(0.01)
    spending.settle()
    await budgets.aclose()
    spent = await budgets.refusal(caller, None)
    assert spent.message.startswith("API key key_abc (sk-sy-abcdef…) has spent its budget for today ($0.01)")


async def test_what_requests_in_flight_hold_is_worth_a_retry_soon():
    budgets = Budgets(LocalLimiter())
    caller = principal(team_day=0.01)
    holding = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert await holding.reserve(0.008)
    assert not await budgets.open(caller, f"req_{uuid.uuid4().hex}").reserve(0.005)
    refusal = await budgets.refusal(caller, (0.005, "m"))
    assert "while other requests in flight hold the rest" in refusal.message
    assert refusal.headers() == {"retry-after": "1"}
    holding.settle()
    await budgets.aclose()


def _clock_at(at: float) -> ManualClock:
    clock = ManualClock()
    clock.now = at
    return clock


async def test_a_spent_budget_is_retried_when_it_renews_and_the_message_names_the_time():
    now = time.time()
    midnight = start_of_utc_day(now) + 86_400
    budgets = Budgets(LocalLimiter(), clock=_clock_at(midnight - 30))
    caller = principal(team_day=0.01)
    spending = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert await spending.reserve(0.008)
    spending.charge(0.008)
    spending.settle()
    await budgets.aclose()  # settled
    renews = dt.datetime.fromtimestamp(midnight, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    refusal = await budgets.refusal(caller, (0.005, "m"))
    assert "Team 'research' has $0.002000 left of its budget for today ($0.01)" in refusal.message
    assert f"it renews at {renews}" in refusal.message
    assert refusal.headers() == {"retry-after": "30"}  # the OpenAI SDK waits for it and retries

    budgets.clock = _clock_at(midnight - 5 * 3600)
    later = await budgets.refusal(caller, (0.005, "m"))
    assert later.headers() == {"retry-after": str(RETRY_AFTER_CAP_S), "x-should-retry": "false"}


async def test_a_spent_month_waits_for_the_first_of_the_next_month():
    now = time.time()
    day = dt.datetime.fromtimestamp(now, dt.UTC)
    first = dt.datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=dt.UTC)
    budgets = Budgets(LocalLimiter(), clock=_clock_at(first.timestamp() - 90))
    caller = Principal(
        Team("research", budget_usd_per_day=5, budget_usd_per_month=0.01),
        ApiKey("key_abc", "research", "sk-sy-abcdef…", b"d" * 32),
    )
    spending = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert await spending.reserve(0.01)
    spending.charge(0.01)
    spending.settle()
    await budgets.aclose()

    refusal = await budgets.refusal(caller, None)
    assert refusal.message == (
        f"Team 'research' has spent its budget for this month ($0.01); it renews at {first:%Y-%m-%dT%H:%M:%SZ}."
    )
    assert refusal.headers() == {"retry-after": "90", "x-should-retry": "false"}  # past the SDK's minute


async def test_a_settlement_waits_out_a_valkey_outage(valkey):
    budgets = Budgets(ValkeyLimiter(valkey.url, timeout_s=30))  # a slow answer is not an outage here
    await budgets.limiter.start()
    caller = principal(team_day=1.0)
    [scope] = budget_scopes(caller)
    spending = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert await spending.reserve(0.5)
    spending.charge(0.25)
    settle, failed = budgets.limiter.settle, asyncio.Event()

    async def settle_noting_failures(*args, **kwargs) -> None:
        try:
            await settle(*args, **kwargs)
        except LimitsUnavailable:
            failed.set()
            raise

    budgets.limiter.settle = settle_noting_failures
    with valkey.stopped():  # comes back empty: only the settlement writes the spend
        spending.settle()
        await asyncio.wait_for(failed.wait(), 30)  # the first try has failed while it is down
    await asyncio.wait_for(asyncio.gather(*budgets._settling), timeout=30)
    assert await budgets.limiter.spent(scope) == (pytest.approx(0.25), 0.0)
    await budgets.aclose()
