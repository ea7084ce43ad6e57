"""The `Limiter` protocol: budgets reserved before a call and settled after it, and rate limits.

Two implementations keep the same behaviour: `LocalLimiter` (this process only, the default) and
`ValkeyLimiter` (shared by every replica). `now` / `at` are unix seconds; left out, the limiter
reads its own clock (Valkey's, for the shared one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from switchyard.billing.limits.scopes import BudgetScope, RateScope, RateStatus


class Limiter(Protocol):
    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def check_rate(self, scopes: Sequence[RateScope], tokens: int, now: float | None = None) -> RateStatus | None:
        """Take one request and `tokens` tokens from every scope, all or nothing.

        Raises `RateLimitExceeded` when any scope cannot pay; None when no scope has a limit.
        """
        ...

    async def headroom(self, scopes: Sequence[BudgetScope], now: float | None = None) -> float | None:
        """The least, over scopes, of limit - spent - reserved (USD); None without scopes."""
        ...

    async def reserve(
        self,
        scopes: Sequence[BudgetScope],
        reservation_id: str,
        amount_usd: float,
        ttl_s: float,
        now: float | None = None,
    ) -> bool:
        """Hold `amount_usd` in every scope if it fits in all (a scope at or over its limit refuses even 0).

        The same id again adds to its reservation. A reservation not settled within `ttl_s` is dropped.
        """
        ...

    async def settle(self, scopes: Sequence[BudgetScope], reservation_id: str, actual_usd: float, at: float) -> None:
        """Release the reservation and add `actual_usd` to spent in the periods of `at` (the request's start)."""
        ...

    async def seed_spent(self, scope: BudgetScope, at: float, amount_usd: float) -> None:
        """Set spent for the period of `at`, only if nothing is recorded there yet."""
        ...

    async def spent(self, scope: BudgetScope, now: float | None = None) -> tuple[float, float]:
        """(spent, reserved) in USD for the period of `now`."""
        ...
