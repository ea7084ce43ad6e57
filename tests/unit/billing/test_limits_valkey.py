"""`ValkeyLimiter` against a real Valkey: replicas sharing it, its own clock, and Valkey going away.

Outages are real: the server is stopped (connections refused) or paused with SIGSTOP (connections
hang), then started again on the same port, empty, as a Valkey that lost its data would be.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from switchyard.billing.limits import (
    BudgetScope,
    LocalLimiter,
    RateScope,
    ValkeyLimiter,
    open_limiter,
)
from switchyard.billing.limits.valkey import display_url
from switchyard.core.errors import LimitsUnavailable, RateLimitExceeded
from switchyard.core.settings import BillingSettings
from tests.servers.valkey import EmbeddedValkey, valkey_fixture, valkey_session_fixture  # noqa: F401

NOON = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC).timestamp()
TTL_S = 900.0
LOGGER = "switchyard.billing.limits.valkey"


@pytest.fixture
async def open_limiters(valkey: EmbeddedValkey) -> AsyncIterator[Callable[..., ValkeyLimiter]]:
    """Make started limiters on the test's Valkey (each its own client, as replicas would); all closed after."""
    made: list[ValkeyLimiter] = []

    async def make(**options) -> ValkeyLimiter:
        options = {"timeout_s": 30.0} | options  # a slow answer on a busy machine is not an outage
        limiter = ValkeyLimiter(valkey.url, **options)
        made.append(limiter)
        await limiter.start()
        return limiter

    yield make
    for limiter in made:
        await limiter.aclose()


# --- replicas sharing one Valkey ---------------------------------------------------------------------


async def test_two_replicas_hold_one_budget_together(open_limiters) -> None:
    replicas = [await open_limiters(), await open_limiters()]
    scope = BudgetScope("team:search", "day", 0.05)
    granted = await asyncio.gather(
        *(replicas[i % 2].reserve([scope], f"r{i}", 0.001, TTL_S, now=NOON) for i in range(500))
    )
    assert sum(granted) == 50
    assert sum(granted[0::2]) > 0 and sum(granted[1::2]) > 0
    assert await replicas[0].spent(scope, now=NOON) == pytest.approx((0.0, 0.05))
    await replicas[1].settle([scope], "r0", 0.0005, at=NOON)
    assert await replicas[0].spent(scope, now=NOON) == pytest.approx((0.0005, 0.049))


async def test_two_replicas_hold_one_rate_limit_together(open_limiters) -> None:
    replicas = [await open_limiters(), await open_limiters()]
    requests, tokens = RateScope("key:key_ab12", rpm=30), RateScope("team:search", tpm=10_000)

    async def attempt(i: int, scope: RateScope, num_tokens: int) -> bool:
        try:
            await replicas[i % 2].check_rate([scope], num_tokens, now=NOON)
        except RateLimitExceeded:
            return False
        return True

    assert sum(await asyncio.gather(*(attempt(i, requests, 1) for i in range(100)))) == 30
    assert sum(await asyncio.gather(*(attempt(i, tokens, 1000) for i in range(40)))) == 10


async def test_on_valkeys_clock_the_count_is_bounded_by_the_refill(open_limiters) -> None:
    """No `now`: Valkey's TIME drives the refill, so a burst gets the bucket plus what refilled meanwhile."""
    replicas = [await open_limiters(), await open_limiters()]
    scope = RateScope("key:key_ab12", rpm=60)  # one more request per second

    async def attempt(i: int) -> bool:
        try:
            await replicas[i % 2].check_rate([scope], 1)
        except RateLimitExceeded:
            return False
        return True

    started = time.monotonic()
    admitted = sum(await asyncio.gather(*(attempt(i) for i in range(200))))
    elapsed_s = time.monotonic() - started
    assert 60 <= admitted <= 60 + elapsed_s + 1
    with pytest.raises(RateLimitExceeded) as refused:
        while True:  # drain what refilled since; the bucket runs dry at once
            await replicas[0].check_rate([scope], 1)
    assert 0 < refused.value.retry_after_s <= 1.0


async def test_on_valkeys_clock_a_dead_reservation_lapses(open_limiters) -> None:
    limiter = await open_limiters()
    scope = BudgetScope("team:search", "day", 1.0)
    before = time.time()  # Valkey's clock is this machine's: the hold lapses after before + 1 s
    assert await limiter.reserve([scope], "crashed", 0.9, ttl_s=1.0)
    # Still held within its TTL: asked at a moment inside it, not "right now" (a busy machine may be
    # a second late already).
    assert not await limiter.reserve([scope], "r2", 0.5, TTL_S, now=before)
    await asyncio.sleep(1.05)  # past the TTL on Valkey's clock, however late this wakes up
    assert await limiter.reserve([scope], "r2", 0.5, TTL_S)
    assert (await limiter.spent(scope))[1] == pytest.approx(0.5)


# --- keys ----------------------------------------------------------------------------------------------


async def test_keys_carry_the_period_and_expire_after_it(open_limiters, valkey: EmbeddedValkey) -> None:
    limiter = await open_limiters()
    daily, monthly = BudgetScope("team:search", "day", 1.0), BudgetScope("key:key_ab12", "month", 5.0)
    now = time.time()
    assert await limiter.reserve([daily, monthly], "r1", 0.5, TTL_S, now=now)
    await limiter.settle([daily, monthly], "r1", 0.25, at=now)
    await limiter.check_rate([RateScope("team:search", rpm=10)], 1)
    today = dt.datetime.fromtimestamp(now, dt.UTC)
    day_key = f"switchyard:budget:team:search:d:{today:%Y-%m-%d}:spent"
    month_key = f"switchyard:budget:key:key_ab12:m:{today:%Y-%m}:spent"
    with valkey.client() as client:
        assert client.get(day_key) == "250000000"  # nano-dollars
        assert 0 < client.ttl(day_key) <= daily.keep_s(now) <= 2 * 86_400
        assert 0 < client.ttl(month_key) <= monthly.keep_s(now) <= 32 * 86_400
        assert 0 < client.ttl("switchyard:rate:team:search:requests") <= 61


async def test_a_script_flush_is_survived(open_limiters, valkey: EmbeddedValkey) -> None:
    limiter = await open_limiters()
    scope = BudgetScope("team:search", "day", 1.0)
    assert await limiter.reserve([scope], "r1", 0.5, TTL_S, now=NOON)
    with valkey.client() as client:
        client.script_flush()
    assert await limiter.reserve([scope], "r2", 0.5, TTL_S, now=NOON)  # NOSCRIPT: loaded again
    assert not await limiter.reserve([scope], "r3", 0.1, TTL_S, now=NOON)


# --- Valkey down ---------------------------------------------------------------------------------------


async def test_fails_closed_by_default_and_recovers_without_a_restart(open_limiters, valkey: EmbeddedValkey) -> None:
    limiter = await open_limiters()
    scope, rate = BudgetScope("team:search", "day", 1.0), RateScope("team:search", rpm=10)
    assert await limiter.reserve([scope], "before", 0.5, TTL_S, now=NOON)
    with valkey.stopped():
        with pytest.raises(LimitsUnavailable) as down:
            await limiter.reserve([scope], "r1", 0.1, TTL_S, now=NOON)
        assert down.value.status_code == 503
        assert valkey.url in down.value.message and "fail_open" in down.value.message
        assert down.value.headers() == {"retry-after": "1"}
        for call in (
            limiter.check_rate([rate], 1, now=NOON),
            limiter.headroom([scope], now=NOON),
            limiter.settle([scope], "before", 0.5, at=NOON),
            limiter.seed_spent(scope, NOON, 0.5),
            limiter.spent(scope, now=NOON),
        ):
            with pytest.raises(LimitsUnavailable):
                await call
    # the same limiter, the same port, a server that lost everything (scripts included)
    assert await limiter.spent(scope, now=NOON) == (0.0, 0.0)
    await limiter.seed_spent(scope, NOON, 0.5)  # what the proxy reads back from its ledger
    assert not await limiter.reserve([scope], "r2", 0.6, TTL_S, now=NOON)
    assert await limiter.reserve([scope], "r2", 0.5, TTL_S, now=NOON)
    assert await limiter.check_rate([rate], 1, now=NOON) is not None


async def test_fails_open_when_asked_warning_at_most_every_30_s(
    open_limiters, valkey: EmbeddedValkey, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = await open_limiters(fail_open=True)
    scope, rate = BudgetScope("team:search", "day", 0.01), RateScope("team:search", rpm=1)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with valkey.stopped():
        assert await limiter.check_rate([rate], 1, now=NOON) is None
        assert await limiter.check_rate([rate], 1, now=NOON) is None  # no limit while it is down
        assert await limiter.reserve([scope], "r1", 5.0, TTL_S, now=NOON)  # beyond the budget
        assert await limiter.headroom([scope], now=NOON) is None
        await limiter.settle([scope], "r1", 5.0, at=NOON)  # dropped
        await limiter.seed_spent(scope, NOON, 1.0)  # dropped
        with pytest.raises(LimitsUnavailable):
            await limiter.spent(scope, now=NOON)  # a read has nothing to fall back on
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "fail_open is true" in warnings[0].getMessage() and valkey.url in warnings[0].getMessage()
    assert await limiter.check_rate([rate], 1, now=NOON) is not None
    with pytest.raises(RateLimitExceeded):
        await limiter.check_rate([rate], 1, now=NOON)
    assert any(r.levelno == logging.INFO and "answers again" in r.getMessage() for r in caplog.records)


async def test_a_restart_between_two_calls_goes_unnoticed(open_limiters, valkey: EmbeddedValkey) -> None:
    limiter = await open_limiters()
    scope = BudgetScope("team:search", "day", 1.0)
    assert await limiter.reserve([scope], "r1", 0.5, TTL_S, now=NOON)  # leaves a connection in the pool
    with valkey.stopped():
        pass
    assert await limiter.reserve([scope], "r2", 1.0, TTL_S, now=NOON)  # that connection is dead: retried


async def test_a_hung_server_times_out_instead_of_blocking(open_limiters, valkey: EmbeddedValkey) -> None:
    limiter = await open_limiters(timeout_s=0.5)
    scope = BudgetScope("team:search", "day", 1.0)
    with valkey.paused():
        with pytest.raises(LimitsUnavailable) as hung:
            await limiter.reserve([scope], "r1", 0.1, TTL_S, now=NOON)
    assert "Timeout" in hung.value.message
    # The same limiter works again once the server does; on a busy machine the server, just woken
    # up, may take longer than the 0.5 s timeout to answer, so a timeout here is tried again.
    async with asyncio.timeout(30):
        while True:
            try:
                assert await limiter.reserve([scope], "r2", 0.1, TTL_S, now=NOON)
                break
            except LimitsUnavailable as exc:
                assert "Timeout" in exc.message


async def test_start_with_valkey_down_does_not_raise(valkey: EmbeddedValkey, caplog: pytest.LogCaptureFixture) -> None:
    limiter = ValkeyLimiter(valkey.url)
    try:
        with valkey.stopped():
            await limiter.start()
            assert any(r.levelno == logging.WARNING for r in caplog.records if r.name == LOGGER)
        assert await limiter.headroom([BudgetScope("team:search", "day", 1.0)], now=NOON) == pytest.approx(1.0)
    finally:
        await limiter.aclose()


# --- configuration ---------------------------------------------------------------------------------------


async def test_open_limiter_follows_the_settings() -> None:
    assert isinstance(open_limiter(BillingSettings()), LocalLimiter)
    shared = open_limiter(BillingSettings(redis_url="redis://:secret@127.0.0.1:1/0", fail_open=True))
    try:
        assert isinstance(shared, ValkeyLimiter)
        assert shared.fail_open
        assert "secret" not in shared.display_url
    finally:
        await shared.aclose()


def test_the_display_url_masks_the_password() -> None:
    assert display_url("redis://user:pw@cache:6379/0") == "redis://user:***@cache:6379/0"
    assert display_url("redis://:pw@cache:6379/0") == "redis://:***@cache:6379/0"
    assert display_url("redis://cache:6379/0") == "redis://cache:6379/0"
