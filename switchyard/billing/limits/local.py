"""`LocalLimiter`: budgets and rate limits counted in this process (the default without `redis_url`).

The same rules as `ValkeyLimiter` (see `switchyard.billing.limits` for the token bucket), with plain
dicts: every method runs to completion without awaiting, so on one event loop each check-and-reserve
is atomic and concurrent requests cannot all slip past one remaining dollar.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from switchyard.billing.limits.errors import rate_refusal
from switchyard.billing.limits.scopes import (
    BucketLevel,
    BudgetScope,
    RateScope,
    RateStatus,
    tightest,
    to_nano_usd,
    to_usd,
)


@dataclass
class _Period:
    keep_until: float
    spent: int | None = None  # nano-USD; None: nothing recorded yet (seed_spent may set it)
    held: dict[str, tuple[int, float]] = field(default_factory=dict)  # reservation id -> (nano-USD, expires at)

    def reserved(self, now: float) -> int:
        for reservation_id in [rid for rid, (_, expires_at) in self.held.items() if expires_at <= now]:
            del self.held[reservation_id]
        return sum(amount for amount, _ in self.held.values())


@dataclass
class _Bucket:
    level: float
    updated_at: float


def rate_costs(scopes: Sequence[RateScope], tokens: int) -> list[tuple[str, str, int, int]]:
    """(scope, kind, capacity, cost) for every limit the scopes set."""
    costs = []
    for scope in dict.fromkeys(scopes):  # the same scope twice would pay twice
        if scope.rpm is not None:
            costs.append((scope.name, "requests", scope.rpm, 1))
        if scope.tpm is not None:
            costs.append((scope.name, "tokens", scope.tpm, tokens))
    return costs


class LocalLimiter:
    def __init__(self) -> None:
        self._periods: dict[tuple[str, str], _Period] = {}
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def check_rate(self, scopes: Sequence[RateScope], tokens: int, now: float | None = None) -> RateStatus | None:
        costs = rate_costs(scopes, tokens)
        if not costs:
            return None
        now = time.time() if now is None else now
        levels = [
            BucketLevel(name, kind, capacity, self._level(name, kind, capacity, now))
            for name, kind, capacity, _ in costs
        ]
        refused = [(bucket, cost) for bucket, (*_, cost) in zip(levels, costs, strict=True) if cost > bucket.level]
        if refused:
            raise rate_refusal(levels, refused)
        after = []
        for bucket, (*_, cost) in zip(levels, costs, strict=True):
            previous = self._buckets.get((bucket.scope, bucket.kind))
            updated_at = now if previous is None else max(previous.updated_at, now)
            self._buckets[(bucket.scope, bucket.kind)] = _Bucket(bucket.level - cost, updated_at)
            after.append(BucketLevel(bucket.scope, bucket.kind, bucket.capacity, bucket.level - cost))
        return tightest(after)

    def _level(self, name: str, kind: str, capacity: int, now: float) -> float:
        bucket = self._buckets.get((name, kind))
        if bucket is None:
            return float(capacity)
        elapsed = max(0.0, now - bucket.updated_at)
        return min(float(capacity), bucket.level + elapsed * capacity / 60.0)

    async def headroom(self, scopes: Sequence[BudgetScope], now: float | None = None) -> float | None:
        if not scopes:
            return None
        now = time.time() if now is None else now
        return to_usd(min(self._room(scope, now) for scope in scopes))

    def _room(self, scope: BudgetScope, now: float) -> int:
        period = self._period(scope, now)
        return to_nano_usd(scope.limit_usd) - (period.spent or 0) - period.reserved(now)

    async def reserve(
        self,
        scopes: Sequence[BudgetScope],
        reservation_id: str,
        amount_usd: float,
        ttl_s: float,
        now: float | None = None,
    ) -> bool:
        now = time.time() if now is None else now
        scopes = list(dict.fromkeys(scopes))
        amount = to_nano_usd(amount_usd)
        rooms = [self._room(scope, now) for scope in scopes]
        if any(room <= 0 or amount > room for room in rooms):
            return False
        for scope in scopes:
            held = self._period(scope, now).held
            previous, _ = held.get(reservation_id, (0, 0.0))
            held[reservation_id] = (previous + amount, now + ttl_s)
        return True

    async def settle(self, scopes: Sequence[BudgetScope], reservation_id: str, actual_usd: float, at: float) -> None:
        wall_now = time.time()
        for scope in dict.fromkeys(scopes):
            for moment in {at, wall_now}:  # a reservation made just after midnight sits in the next period
                period = self._periods.get((scope.name, scope.period_id(moment)))
                if period is not None:
                    period.held.pop(reservation_id, None)
            period = self._period(scope, at)
            period.spent = (period.spent or 0) + to_nano_usd(actual_usd)

    async def seed_spent(self, scope: BudgetScope, at: float, amount_usd: float) -> None:
        period = self._period(scope, at)
        if period.spent is None:
            period.spent = to_nano_usd(amount_usd)

    async def spent(self, scope: BudgetScope, now: float | None = None) -> tuple[float, float]:
        now = time.time() if now is None else now
        period = self._period(scope, now)
        return to_usd(period.spent or 0), to_usd(period.reserved(now))

    def _period(self, scope: BudgetScope, at: float) -> _Period:
        key = (scope.name, scope.period_id(at))
        period = self._periods.get(key)
        if period is None:
            # a new period is rare (once a day per scope): the moment to forget the ended ones
            for old in [k for k, p in self._periods.items() if p.keep_until < at]:
                del self._periods[old]
            period = self._periods[key] = _Period(keep_until=at + scope.keep_s(at))
        return period
