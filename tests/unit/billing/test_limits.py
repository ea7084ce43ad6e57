"""Budgets and rate limits: the same behaviours from `LocalLimiter` and `ValkeyLimiter` (a real Valkey).

Time is passed explicitly (`now`, `at`), so refills and expiries are exact; the tests that let real
time pass live in test_limits_valkey.py and bound their counts instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import pytest

from switchyard.billing.limits import (
    BudgetScope,
    Limiter,
    LocalLimiter,
    RateScope,
    ValkeyLimiter,
)
from switchyard.core.errors import RateLimitExceeded
from tests.servers.valkey import valkey_fixture, valkey_session_fixture  # noqa: F401

NOON = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC).timestamp()
LAST_SECOND = dt.datetime(2026, 11, 23, 23, 59, 59, tzinfo=dt.UTC).timestamp()
NEXT_DAY = dt.datetime(2026, 11, 24, 0, 0, 1, tzinfo=dt.UTC).timestamp()
NEXT_MONTH = dt.datetime(2026, 12, 1, 0, 0, 1, tzinfo=dt.UTC).timestamp()
TTL_S = 900.0


@pytest.fixture(params=["local", "valkey"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    if request.param == "local":
        instance: Limiter = LocalLimiter()
    else:
        instance = ValkeyLimiter(request.getfixturevalue("valkey").url, timeout_s=30)  # a busy machine is no outage
    await instance.start()
    try:
        yield instance
    finally:
        await instance.aclose()


def day(name: str = "team:search", limit_usd: float = 1.0) -> BudgetScope:
    return BudgetScope(name, "day", limit_usd)


# --- budgets -----------------------------------------------------------------------------------------


async def test_a_reservation_is_held_until_the_budget_is_full(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "r1", 0.6, TTL_S, now=NOON)
    assert not await limiter.reserve([scope], "r2", 0.5, TTL_S, now=NOON)
    assert await limiter.headroom([scope], now=NOON) == pytest.approx(0.4)
    assert await limiter.reserve([scope], "r3", 0.4, TTL_S, now=NOON)  # exactly fills it
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.0, 1.0))
    assert not await limiter.reserve([scope], "r4", 0.0, TTL_S, now=NOON)  # at the limit: not even 0


async def test_settle_releases_the_hold_and_counts_the_real_cost(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "r1", 0.8, TTL_S, now=NOON)
    await limiter.settle([scope], "r1", 0.25, at=NOON)
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.25, 0.0))
    assert await limiter.reserve([scope], "r2", 0.75, TTL_S, now=NOON)
    assert not await limiter.reserve([scope], "r3", 0.01, TTL_S, now=NOON)


async def test_the_same_id_adds_to_its_reservation(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "cascade", 0.3, TTL_S, now=NOON)
    assert await limiter.reserve([scope], "cascade", 0.3, TTL_S, now=NOON)  # before climbing a rung
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.0, 0.6))
    assert not await limiter.reserve([scope], "cascade", 0.5, TTL_S, now=NOON)  # 1.1 would not fit
    await limiter.settle([scope], "cascade", 0.45, at=NOON)
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.45, 0.0))


async def test_a_reservation_fits_every_scope_or_none(limiter: Limiter) -> None:
    team, key = day("team:search", 1.0), day("key:key_ab12", 0.2)
    assert not await limiter.reserve([team, key], "r1", 0.3, TTL_S, now=NOON)
    assert await limiter.spent(team, now=NOON) == (0.0, 0.0)  # the team that had room holds nothing
    assert await limiter.reserve([team, key], "r2", 0.2, TTL_S, now=NOON)
    assert await limiter.spent(team, now=NOON) == pytest.approx((0.0, 0.2))
    assert await limiter.headroom([team, key], now=NOON) == pytest.approx(0.0)
    assert await limiter.headroom([team], now=NOON) == pytest.approx(0.8)


async def test_a_scope_named_twice_is_held_and_charged_once(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope, scope], "r1", 0.6, TTL_S, now=NOON)
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.0, 0.6))
    await limiter.settle([scope, scope], "r1", 0.5, at=NOON)
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.5, 0.0))
    status = await limiter.check_rate([RateScope("key:k", rpm=2)] * 2, 1, now=NOON)
    assert status is not None and status.remaining_requests == 1


async def test_headroom_without_scopes_is_none(limiter: Limiter) -> None:
    assert await limiter.headroom([], now=NOON) is None
    assert await limiter.headroom([day(limit_usd=0.5)], now=NOON) == pytest.approx(0.5)


async def test_a_dead_reservation_lapses_after_its_ttl(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "crashed-replica", 0.8, 10.0, now=NOON)
    assert not await limiter.reserve([scope], "r2", 0.5, TTL_S, now=NOON + 9.9)
    assert await limiter.spent(scope, now=NOON + 10.0) == (0.0, 0.0)
    assert await limiter.reserve([scope], "r2", 0.5, TTL_S, now=NOON + 10.0)


async def test_a_settle_after_the_ttl_still_counts_its_cost(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "slow", 0.5, 10.0, now=NOON)
    await limiter.settle([scope], "slow", 0.4, at=NOON)
    assert await limiter.spent(scope, now=NOON + 60) == pytest.approx((0.4, 0.0))


async def test_the_day_rolls_over_at_midnight_utc(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "r1", 0.9, TTL_S, now=NOON)
    await limiter.settle([scope], "r1", 0.9, at=NOON)
    assert await limiter.headroom([scope], now=LAST_SECOND) == pytest.approx(0.1)
    assert not await limiter.reserve([scope], "r2", 0.2, TTL_S, now=LAST_SECOND)
    assert await limiter.reserve([scope], "r3", 0.2, TTL_S, now=NEXT_DAY)
    assert await limiter.spent(scope, now=NEXT_DAY) == pytest.approx((0.0, 0.2))
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.9, 0.0))


async def test_a_request_started_before_midnight_is_charged_to_that_day(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    assert await limiter.reserve([scope], "late", 0.3, TTL_S, now=LAST_SECOND)
    await limiter.settle([scope], "late", 0.3, at=LAST_SECOND)
    assert await limiter.spent(scope, now=LAST_SECOND) == pytest.approx((0.3, 0.0))
    assert await limiter.spent(scope, now=NEXT_DAY) == (0.0, 0.0)


async def test_a_month_budget_adds_up_the_days_of_its_month(limiter: Limiter) -> None:
    month = BudgetScope("team:search", "month", 1.0)
    for i, at in enumerate((NOON, NEXT_DAY)):
        assert await limiter.reserve([month], f"r{i}", 0.4, TTL_S, now=at)
        await limiter.settle([month], f"r{i}", 0.4, at=at)
    assert await limiter.spent(month, now=NEXT_DAY) == pytest.approx((0.8, 0.0))
    assert not await limiter.reserve([month], "r2", 0.3, TTL_S, now=NEXT_DAY)
    assert await limiter.reserve([month], "r3", 0.3, TTL_S, now=NEXT_MONTH)


async def test_day_and_month_budgets_of_one_team_are_apart(limiter: Limiter) -> None:
    daily, monthly = BudgetScope("team:search", "day", 1.0), BudgetScope("team:search", "month", 5.0)
    assert await limiter.reserve([daily, monthly], "r1", 1.0, TTL_S, now=NOON)
    await limiter.settle([daily, monthly], "r1", 1.0, at=NOON)
    assert await limiter.spent(daily, now=NOON) == pytest.approx((1.0, 0.0))
    assert await limiter.spent(monthly, now=NOON) == pytest.approx((1.0, 0.0))
    assert await limiter.headroom([daily, monthly], now=NOON) == pytest.approx(0.0)
    assert await limiter.headroom([daily, monthly], now=NEXT_DAY) == pytest.approx(1.0)
    assert await limiter.headroom([monthly], now=NEXT_DAY) == pytest.approx(4.0)


async def test_seed_spent_fills_an_empty_period_only(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    await limiter.seed_spent(scope, NOON, 0.7)
    await limiter.seed_spent(scope, NOON, 0.1)  # a second start finds it there and leaves it
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.7, 0.0))
    assert not await limiter.reserve([scope], "r1", 0.4, TTL_S, now=NOON)
    settled = day("team:other", 1.0)
    assert await limiter.reserve([settled], "r2", 0.2, TTL_S, now=NOON)
    await limiter.settle([settled], "r2", 0.2, at=NOON)
    await limiter.seed_spent(settled, NOON, 0.9)  # spend already recorded there wins
    assert await limiter.spent(settled, now=NOON) == pytest.approx((0.2, 0.0))


async def test_a_scope_already_over_its_limit_refuses_everything(limiter: Limiter) -> None:
    scope = day(limit_usd=1.0)
    await limiter.seed_spent(scope, NOON, 1.5)
    assert await limiter.headroom([scope], now=NOON) == pytest.approx(-0.5)
    assert not await limiter.reserve([scope], "r1", 0.0, TTL_S, now=NOON)


async def test_concurrent_reservations_admit_exactly_what_fits(limiter: Limiter) -> None:
    scope = day(limit_usd=0.05)
    granted = await asyncio.gather(*(limiter.reserve([scope], f"r{i}", 0.001, TTL_S, now=NOON) for i in range(500)))
    assert sum(granted) == 50
    assert await limiter.spent(scope, now=NOON) == pytest.approx((0.0, 0.05))


async def test_concurrent_requests_cannot_spend_past_the_budget(limiter: Limiter) -> None:
    """The issue's trial: 200 concurrent requests against $0.01/day spent $0.20 on main."""
    scope = day(limit_usd=0.01)

    async def request(i: int) -> bool:
        if not await limiter.reserve([scope], f"req-{i}", 0.0004, TTL_S, now=NOON):  # worst case
            return False
        await asyncio.sleep(0)  # the upstream call
        await limiter.settle([scope], f"req-{i}", 0.0003, at=NOON)  # the real cost
        return True

    answered = sum(await asyncio.gather(*(request(i) for i in range(200))))
    spent, reserved = await limiter.spent(scope, now=NOON)
    assert reserved == 0.0
    assert spent == pytest.approx(answered * 0.0003)
    assert 25 <= answered < 200  # at least the worst cases that fit; far from all of them
    assert spent <= 0.01


# --- rate limits -------------------------------------------------------------------------------------


async def test_no_limits_means_no_status(limiter: Limiter) -> None:
    assert await limiter.check_rate([], 100, now=NOON) is None
    assert await limiter.check_rate([RateScope("team:search")], 100, now=NOON) is None


async def test_requests_per_minute_refill_continuously(limiter: Limiter) -> None:
    scope = RateScope("key:key_ab12", rpm=3)
    for remaining in (2, 1, 0):
        status = await limiter.check_rate([scope], 10, now=NOON)
        assert status is not None
        assert (status.limit_requests, status.remaining_requests) == (3, remaining)
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.check_rate([scope], 10, now=NOON)
    assert refused.value.retry_after_s == pytest.approx(20.0)  # one request of three a minute
    assert refused.value.status.remaining_requests == 0
    assert refused.value.headers()["retry-after"] == "20"
    assert refused.value.headers()["x-ratelimit-limit-requests"] == "3"
    assert "key:key_ab12" in refused.value.message
    with pytest.raises(RateLimitExceeded):
        await limiter.check_rate([scope], 10, now=NOON + 19.9)
    status = await limiter.check_rate([scope], 10, now=NOON + 20.0)
    assert status is not None and status.remaining_requests == 0
    assert status.reset_requests_s == pytest.approx(60.0)


async def test_tokens_per_minute(limiter: Limiter) -> None:
    scope = RateScope("team:search", tpm=1000)
    status = await limiter.check_rate([scope], 600, now=NOON)
    assert status is not None
    assert (status.limit_tokens, status.remaining_tokens, status.limit_requests) == (1000, 400, None)
    assert status.reset_tokens_s == pytest.approx(36.0)
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.check_rate([scope], 600, now=NOON)
    assert refused.value.retry_after_s == pytest.approx(12.0)  # 200 tokens at 1000 a minute
    assert await limiter.check_rate([scope], 600, now=NOON + 12.0) is not None


async def test_a_request_larger_than_a_minute_of_tokens_is_refused_without_retry_after(limiter: Limiter) -> None:
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.check_rate([RateScope("team:search", tpm=100)], 200, now=NOON)
    assert refused.value.retry_after_s is None
    assert "retry-after" not in refused.value.headers()
    assert "cannot be admitted" in refused.value.message


async def test_a_refused_check_takes_nothing_from_any_scope(limiter: Limiter) -> None:
    key, team = RateScope("key:key_ab12", rpm=2), RateScope("team:search", rpm=1)
    assert await limiter.check_rate([key, team], 1, now=NOON) is not None
    with pytest.raises(RateLimitExceeded) as refused:
        await limiter.check_rate([key, team], 1, now=NOON)
    assert "team:search" in refused.value.message
    status = await limiter.check_rate([key], 1, now=NOON)  # the key still had its second request
    assert status is not None and status.remaining_requests == 0
    with pytest.raises(RateLimitExceeded):
        await limiter.check_rate([key], 1, now=NOON)


async def test_the_status_reports_the_tightest_scope_of_each_kind(limiter: Limiter) -> None:
    key, team = RateScope("key:key_ab12", rpm=10), RateScope("team:search", rpm=100, tpm=1000)
    status = await limiter.check_rate([key, team], 50, now=NOON)
    assert status is not None
    assert (status.limit_requests, status.remaining_requests) == (10, 9)
    assert (status.limit_tokens, status.remaining_tokens) == (1000, 950)
    assert set(status.headers()) == {
        f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset") for kind in ("requests", "tokens")
    }


async def test_concurrent_checks_admit_exactly_the_limit(limiter: Limiter) -> None:
    scope = RateScope("key:key_ab12", rpm=20)

    async def attempt() -> bool:
        try:
            await limiter.check_rate([scope], 1, now=NOON)
        except RateLimitExceeded:
            return False
        return True

    assert sum(await asyncio.gather(*(attempt() for _ in range(100)))) == 20
