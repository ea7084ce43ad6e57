"""A caller's budgets over a limiter: the refusals they explain, and settling that outlasts an outage."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from switchyard.billing.budgets import Budgets, budget_scopes
from switchyard.billing.limits import LimitsUnavailable, LocalLimiter, ValkeyLimiter
from switchyard.billing.teams import ApiKey, Principal, Team


def principal(team_day: float | None = None, key_day: float | None = None) -> Principal:
    return Principal(
        Team("research", budget_usd_per_day=team_day),
        ApiKey("key_abc", "research", "sk-sy-abcdef…", b"d" * 32, budget_usd_per_day=key_day),
    )


async def test_a_request_too_big_for_the_keys_budget_names_the_key():
    budgets = Budgets(LocalLimiter())
    caller = principal(team_day=10, key_day=0.01)
    spending = budgets.open(caller, f"req_{uuid.uuid4().hex}")
    assert not await spending.reserve(0.02)
    refusal = await budgets.refusal(caller, (0.02, "m-large"))
    assert "API key key_abc (sk-sy-abcdef…) may still spend ($0.010000)" in refusal.message
    assert await spending.reserve(0.01)
    spending.charge(0.01)
    spending.settle()
    await budgets.aclose()
    spent = await budgets.refusal(caller, None)
    assert spent.message.startswith("API key key_abc (sk-sy-abcdef…) has spent its budget for today ($0.01)")


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
