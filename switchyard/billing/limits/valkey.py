"""`ValkeyLimiter`: budgets and rate limits in Valkey/Redis, shared by every replica.

redis-py's asyncio client runs the scripts in `lua.py` (registered once, EVALSHA, loaded again when
a restarted server answers NOSCRIPT); each check-and-reserve is one script, so two replicas racing
for the last dollar or the last request of a minute cannot both win. Time comes from Valkey's
`TIME` unless the caller passes one; the budget period (which UTC day or month) comes from the
caller's clock or `now`/`at`, so every key a script touches is named in its KEYS.

When Valkey cannot be reached or does not answer within `timeout_s` (1 s): fail closed, raising
`LimitsUnavailable` (503), or with `fail_open=True` let the request through (no rate check, every
reservation granted, settles dropped) and log a WARNING at most every 30 s. Nothing is cached
about the failure: the next call tries again, so a server back on the same address is used at once.
A call that timed out may still have run on a hung server once it wakes: a reservation made that
way lapses after its TTL, and a settle counted that way is spend that happened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from switchyard.billing.limits import lua
from switchyard.billing.limits.errors import rate_refusal
from switchyard.billing.limits.local import rate_costs
from switchyard.billing.limits.scopes import (
    BucketLevel,
    BudgetScope,
    RateScope,
    RateStatus,
    tightest,
    to_nano_usd,
    to_usd,
)
from switchyard.core.errors import LimitsUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
WARN_EVERY_S = 30.0
POOL_WAIT_S = 5.0  # a burst of requests queues this long for a connection before it counts as an outage


def display_url(url: str) -> str:
    """The url with any password masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}:" if parts.username else ":"
    return urlunsplit(parts._replace(netloc=f"{user}***@{netloc}"))


def _clock_arg(now: float | None) -> str:
    return "" if now is None else repr(float(now))


class ValkeyLimiter:
    def __init__(
        self,
        url: str,
        *,
        fail_open: bool = False,
        timeout_s: float = 1.0,
        max_connections: int = 32,
        key_prefix: str = "switchyard:",
    ) -> None:
        self.display_url = display_url(url)
        self.fail_open = fail_open
        self._prefix = key_prefix
        # A bounded pool that makes a burst wait its turn (the default one raises past its size), and
        # one quick retry: the first command after a server restart meets a pooled connection it closed.
        self._pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=POOL_WAIT_S,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            decode_responses=True,
        )
        self._client = aioredis.Redis(connection_pool=self._pool)
        self._check_rate = self._client.register_script(lua.CHECK_RATE)
        self._reserve = self._client.register_script(lua.RESERVE)
        self._settle = self._client.register_script(lua.SETTLE)
        self._standing = self._client.register_script(lua.STANDING)
        self._is_failing = False
        self._last_warning_at = float("-inf")

    async def start(self) -> None:
        """Check the server answers; if it does not, say so and carry on (each call tries again)."""
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            self._note_failure(exc)

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()

    async def check_rate(self, scopes: Sequence[RateScope], tokens: int, now: float | None = None) -> RateStatus | None:
        costs = rate_costs(scopes, tokens)
        if not costs:
            return None
        keys = [f"{self._prefix}rate:{name}:{kind}" for name, kind, _, _ in costs]
        args: list[str | int] = [_clock_arg(now)]
        for _, _, capacity, cost in costs:
            args += [capacity, cost]
        reply = await self._run(lambda: self._check_rate(keys, args), None)
        if reply is None:
            return None
        paid, *levels = reply
        buckets = [
            BucketLevel(name, kind, capacity, float(level))
            for (name, kind, capacity, _), level in zip(costs, levels, strict=True)
        ]
        if not int(paid):
            refused = [(bucket, cost) for bucket, (*_, cost) in zip(buckets, costs, strict=True) if cost > bucket.level]
            raise rate_refusal(buckets, refused)
        return tightest(buckets)

    async def headroom(self, scopes: Sequence[BudgetScope], now: float | None = None) -> float | None:
        if not scopes:
            return None
        standing = await self._run(lambda: self._read_standing(scopes, now), None)
        if standing is None:
            return None
        return to_usd(
            min(to_nano_usd(s.limit_usd) - spent - held for s, (spent, held) in zip(scopes, standing, strict=True))
        )

    async def reserve(
        self,
        scopes: Sequence[BudgetScope],
        reservation_id: str,
        amount_usd: float,
        ttl_s: float,
        now: float | None = None,
    ) -> bool:
        at = time.time() if now is None else now
        scopes = list(dict.fromkeys(scopes))
        keys: list[str] = []
        args: list[str | int | float] = [_clock_arg(now), reservation_id, to_nano_usd(amount_usd), ttl_s]
        for scope in scopes:
            keys += self._budget_keys(scope, at)
            args += [to_nano_usd(scope.limit_usd), scope.keep_s(at)]
        return bool(await self._run(lambda: self._reserve(keys, args), 1))

    async def settle(self, scopes: Sequence[BudgetScope], reservation_id: str, actual_usd: float, at: float) -> None:
        wall_now = time.time()
        scopes = list(dict.fromkeys(scopes))
        spent_keys = [self._budget_keys(scope, at)[0] for scope in scopes]
        release_keys: list[str] = []
        for scope in scopes:
            periods = {scope.period_id(at): at, scope.period_id(wall_now): wall_now}
            for moment in periods.values():  # a reservation made just after midnight sits in the next period
                release_keys += self._budget_keys(scope, moment)[1:]
        args: list[str | int | float] = [
            reservation_id,
            to_nano_usd(actual_usd),
            len(spent_keys),
            *(scope.keep_s(at) for scope in scopes),
        ]
        await self._run(lambda: self._settle(spent_keys + release_keys, args), None)

    async def seed_spent(self, scope: BudgetScope, at: float, amount_usd: float) -> None:
        key = self._budget_keys(scope, at)[0]
        await self._run(lambda: self._client.set(key, to_nano_usd(amount_usd), nx=True, ex=scope.keep_s(at)), None)

    async def spent(self, scope: BudgetScope, now: float | None = None) -> tuple[float, float]:
        """(spent, reserved) in USD; raises `LimitsUnavailable` when Valkey is unreachable, even failing open."""
        try:
            ((spent, held),) = await self._read_standing([scope], now)
        except (RedisError, OSError) as exc:
            self._note_failure(exc)
            raise self._unavailable(exc) from exc
        return to_usd(spent), to_usd(held)

    async def _read_standing(self, scopes: Sequence[BudgetScope], now: float | None) -> list[tuple[int, int]]:
        at = time.time() if now is None else now
        keys = [key for scope in scopes for key in self._budget_keys(scope, at)]
        reply = await self._standing(keys, [_clock_arg(now)])
        return [(int(reply[i]), int(reply[i + 1])) for i in range(0, len(reply), 2)]

    def _budget_keys(self, scope: BudgetScope, at: float) -> list[str]:
        base = f"{self._prefix}budget:{scope.name}:{scope.period_id(at)}"
        return [f"{base}:spent", f"{base}:held", f"{base}:expiry"]

    async def _run(self, call: Callable[[], Awaitable[T]], fallback: T) -> T:
        """`call()`, or when Valkey is unreachable: `fallback` failing open, `LimitsUnavailable` failing closed."""
        try:
            result = await call()
        except (RedisError, OSError) as exc:
            self._note_failure(exc)
            if self.fail_open:
                return fallback
            raise self._unavailable(exc) from exc
        if self._is_failing:
            self._is_failing = False
            log.info("budgets and rate limits: %s answers again", self.display_url)
        return result

    def _unavailable(self, exc: BaseException) -> LimitsUnavailable:
        return LimitsUnavailable(
            f"Budgets and rate limits are unavailable: Valkey/Redis at {self.display_url} did not answer "
            f"({type(exc).__name__}: {exc}). billing.fail_open is false, so requests are refused until it is back."
        )

    def _note_failure(self, exc: BaseException) -> None:
        self._is_failing = True
        now = time.monotonic()
        if now - self._last_warning_at < WARN_EVERY_S:
            return
        self._last_warning_at = now
        consequence = (
            "letting requests through unmetered (billing.fail_open is true)"
            if self.fail_open
            else "refusing requests with 503 (billing.fail_open is false)"
        )
        log.warning(
            "budgets and rate limits: Valkey/Redis at %s is unreachable (%s: %s); %s",
            self.display_url,
            type(exc).__name__,
            exc,
            consequence,
        )
