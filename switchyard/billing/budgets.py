"""Budgets and rate limits applied to one caller: the scopes of its team and key, and each
request's reservation.

Before a call the request reserves its worst-case cost (prompt tokens plus `max_tokens` at the
model's price) in every budget that applies to it — the team's and the key's, per UTC day and per
UTC month — and a request whose reservation does not fit is refused. When the request is over,
the reservation is settled to what the attempts really cost (escalations, retries and fallbacks
included). The counts live in a `Limiter`: this process's, or Valkey/Redis shared by every
replica, so a budget is never exceeded by more than what was in flight when it ran out.
"""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from switchyard.billing.limits import BudgetScope, Limiter, RateScope, RateStatus
from switchyard.billing.teams import Principal, Team
from switchyard.core.errors import BudgetExceeded, LimitsUnavailable

logger = logging.getLogger("switchyard.budgets")
SETTLE_RETRY_MAX_S = 64.0  # settling retries at 0.5, 1, 2, … s, up to this pause
# A spent budget's Retry-After is the time to its renewal, at most this: clients that honour long
# waits come back within the hour, and the OpenAI SDKs (which wait out at most a minute or two) give up.
RETRY_AFTER_CAP_S = 3600


def utc_day(at: float) -> dt.date:
    return dt.datetime.fromtimestamp(at, dt.UTC).date()


def start_of_utc_day(at: float) -> float:
    day = utc_day(at)
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def start_of_utc_month(at: float) -> float:
    day = utc_day(at)
    return dt.datetime(day.year, day.month, 1, tzinfo=dt.UTC).timestamp()


def seconds_to_next_utc_day(at: float) -> float:
    return start_of_utc_day(at) + 86_400 - at


def seconds_to_next_utc_month(at: float) -> float:
    day = utc_day(at)
    return start_of_utc_month(at) + calendar.monthrange(day.year, day.month)[1] * 86_400 - at


def budget_scopes(principal: Principal | None) -> list[BudgetScope]:
    if principal is None:
        return []
    team, key = principal.team, principal.key
    candidates = [
        (f"team:{team.name}", "day", team.budget_usd_per_day),
        (f"team:{team.name}", "month", team.budget_usd_per_month),
        (f"key:{key.id}", "day", key.budget_usd_per_day),
        (f"key:{key.id}", "month", key.budget_usd_per_month),
    ]
    return [BudgetScope(name, period, limit) for name, period, limit in candidates if limit is not None]


def rate_scopes(principal: Principal | None) -> list[RateScope]:
    if principal is None:
        return []
    team, key = principal.team, principal.key
    scopes = [RateScope(f"team:{team.name}", team.rpm, team.tpm), RateScope(f"key:{key.id}", key.rpm, key.tpm)]
    return [scope for scope in scopes if scope.rpm is not None or scope.tpm is not None]


def _whose(scope: BudgetScope, principal: Principal) -> str:
    kind, _, name = scope.name.partition(":")
    return f"Team '{name}'" if kind == "team" else f"API key {name} ({principal.key.prefix})"


def _period_word(scope: BudgetScope) -> str:
    return "today" if scope.period == "day" else "this month"


def _utc_text(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Budgets:
    """The budgets and rate limits of every caller, over one limiter."""

    def __init__(
        self, limiter: Limiter, *, reservation_ttl_s: float = 900.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.limiter = limiter
        self.reservation_ttl_s = reservation_ttl_s
        self.clock = clock  # unix seconds: what a refusal counts the time to a budget's renewal from
        self._settling: set[asyncio.Task[None]] = set()

    async def check_rate(self, principal: Principal | None, tokens: int) -> RateStatus | None:
        """Take one request and `tokens` tokens (raises RateLimitExceeded); the headers' numbers."""
        scopes = rate_scopes(principal)
        return await self.limiter.check_rate(scopes, tokens) if scopes else None

    async def headroom(self, principal: Principal | None) -> float | None:
        """What the caller may still spend (None: no budget); a caller with nothing left is refused."""
        scopes = budget_scopes(principal)
        if not scopes:
            return None
        headroom = await self.limiter.headroom(scopes)
        if headroom is not None and headroom <= 0:
            raise await self.refusal(principal, None)
        return headroom

    async def refusal(self, principal: Principal | None, request: tuple[float, str] | None) -> BudgetExceeded:
        """The 429 for a caller whose budget is spent, or whose request (cost, model) does not fit.

        Worst first: a request bigger than a whole budget never fits (no Retry-After); a budget
        whose spend leaves too little waits for its period's end (the latest, when several do;
        Retry-After capped at `RETRY_AFTER_CAP_S`); else what is left is held by requests in flight,
        which settle soon (Retry-After 1)."""
        assert principal is not None
        now = self.clock()
        cost, model = request if request is not None else (0.0, "")
        on_model = f" on {model}" if model else ""
        standings = [(scope, *await self.limiter.spent(scope)) for scope in budget_scopes(principal)]
        for scope, _, _ in standings:
            if cost > scope.limit_usd:
                return BudgetExceeded(
                    f"This request's worst-case cost (${cost:.6f}{on_model}: the prompt plus max_tokens) is more "
                    f"than the whole budget of {_whose(scope, principal)} for a {scope.period} "
                    f"(${scope.limit_usd:g}): it can never fit. Ask for fewer max_tokens or a cheaper model.",
                    retry_after_s=None,
                )
        spent_out = [(s, spent) for s, spent, _ in standings if spent >= s.limit_usd or spent + cost > s.limit_usd]
        if spent_out:
            scope, spent = max(spent_out, key=lambda pair: pair[0].period_end(now))
            resets_at = scope.period_end(now)
            whose, when, renews = _whose(scope, principal), _period_word(scope), _utc_text(resets_at)
            if spent >= scope.limit_usd:
                message = f"{whose} has spent its budget for {when} (${scope.limit_usd:g}); it renews at {renews}."
            else:
                message = (
                    f"{whose} has ${scope.limit_usd - spent:.6f} left of its budget for {when} "
                    f"(${scope.limit_usd:g}), less than this request's worst-case cost (${cost:.6f}{on_model}: "
                    f"the prompt plus max_tokens); it renews at {renews}. Ask for fewer max_tokens or a cheaper model."
                )
            return BudgetExceeded(message, retry_after_s=min(math.ceil(resets_at - now), RETRY_AFTER_CAP_S))
        tightest, left = None, float("inf")
        for scope, spent, reserved in standings:
            if scope.limit_usd - spent - reserved < left:
                tightest, left = scope, scope.limit_usd - spent - reserved
        whose = _whose(tightest, principal) if tightest is not None else f"Team '{principal.team.name}'"
        return BudgetExceeded(
            f"This request's worst-case cost (${cost:.6f}{on_model}: the prompt plus max_tokens) does not fit in "
            f"what {whose} may still spend (${max(left, 0.0):.6f}) while other requests in flight hold the rest; "
            "retry shortly, or ask for fewer max_tokens or a cheaper model.",
            retry_after_s=1,
        )

    async def used_ratios(self, teams: Iterable[Team]) -> dict[str, float]:
        """Team -> the largest share it has spent of its day and month budgets (teams with one)."""
        ratios: dict[str, float] = {}
        for team in teams:
            for period, limit in (("day", team.budget_usd_per_day), ("month", team.budget_usd_per_month)):
                if limit:
                    spent, _ = await self.limiter.spent(BudgetScope(f"team:{team.name}", period, limit))
                    ratios[team.name] = max(ratios.get(team.name, 0.0), spent / limit)
        return ratios

    def open(self, principal: Principal | None, request_id: str, started_at: float | None = None) -> Spending:
        """One request's spending: reserve before each call, settle once at the end."""
        now = started_at if started_at is not None else time.time()
        return Spending(self, budget_scopes(principal), now, request_id, principal)

    async def seed(
        self, spend_since: Callable[[float], Awaitable[dict[tuple[str, str], float]]], scopes: Sequence[BudgetScope]
    ) -> None:
        """Budgets survive a restart: today's and this month's spend, read back from the ledger,
        wherever the limiter has none recorded yet. `spend_since(t)` is the ledger's
        {(kind, name): usd} since t."""
        now = time.time()
        starts = {"day": start_of_utc_day(now), "month": start_of_utc_month(now)}
        spent = {period: await spend_since(start) for period, start in starts.items()}
        for scope in scopes:
            kind, _, name = scope.name.partition(":")
            amount = spent[scope.period].get((kind, name), 0.0)
            if amount:
                await self.limiter.seed_spent(scope, now, amount)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the settlements under way, then close the limiter."""
        if self._settling:
            _, late = await asyncio.wait(set(self._settling), timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                logger.error("%d reservation(s) not settled at shutdown: the budget store did not answer", len(late))
                await asyncio.gather(*late, return_exceptions=True)
        await self.limiter.aclose()


class Spending:
    """One request against its budgets: what it holds in reserve, and what it really cost."""

    def __init__(
        self,
        budgets: Budgets,
        scopes: list[BudgetScope],
        started_at: float,
        reservation_id: str,
        principal: Principal | None = None,
    ) -> None:
        self.budgets = budgets
        self.principal = principal  # whose budgets (None: no teams configured)
        self.scopes = scopes
        self.started_at = started_at
        self.reservation_id = reservation_id  # unique per request: the request's own id
        self.reserved_usd = 0.0
        self.reserved_for: set[str] = set()  # the models whose worst case is held
        self.cost_usd = 0.0  # every attempt's cost so far
        self.is_settled = False
        self._on_settle: list[Callable[[], None]] = []

    def on_settle(self, callback: Callable[[], None]) -> None:
        """Run `callback()` when the request is over (a priority tier's slot given back)."""
        self._on_settle.append(callback)

    async def reserve_for(self, model: str, amount_usd: float) -> bool:
        """Hold a call to `model`'s worst case, unless it is held already (True: it fits, or is held)."""
        if model in self.reserved_for:
            return True
        if not await self.reserve(amount_usd):
            return False
        self.reserved_for.add(model)
        return True

    async def refusal_for(self, model: str, amount_usd: float) -> BudgetExceeded | None:
        """Why a call to `model` costing `amount_usd` at worst does not fit, and when to retry
        (None: no caller, so no budgets)."""
        if self.principal is None:
            return None
        return await self.budgets.refusal(self.principal, (amount_usd, model))

    async def reserve(self, amount_usd: float) -> bool:
        """Hold `amount_usd` more in every budget; False (and nothing held) if it does not fit."""
        if not self.scopes:
            return True
        fits = await self.budgets.limiter.reserve(
            self.scopes, self.reservation_id, amount_usd, self.budgets.reservation_ttl_s
        )
        if fits:
            self.reserved_usd += amount_usd
        return fits

    def charge(self, cost_usd: float) -> None:
        self.cost_usd += cost_usd

    def settle(self) -> None:
        """The request is over: release the reservation, count what it cost (once; in the background)."""
        if self.is_settled:
            return
        self.is_settled = True
        for callback in self._on_settle:
            callback()
        if not self.scopes:
            return
        task = asyncio.get_running_loop().create_task(self._settle())
        self.budgets._track(task)

    async def _settle(self) -> None:
        """Retried with back-off for about two minutes while the budget store is unreachable: the
        spend would otherwise be lost to the budget (the hold itself lapses after its TTL)."""
        delay_s = 0.5
        while True:
            try:
                await self.budgets.limiter.settle(self.scopes, self.reservation_id, self.cost_usd, self.started_at)
                return
            except LimitsUnavailable as exc:
                if delay_s > SETTLE_RETRY_MAX_S:
                    logger.error("gave up settling $%.6f against the budgets: %s", self.cost_usd, exc.message)
                    return
                await asyncio.sleep(delay_s)
                delay_s *= 2
            except Exception:
                logger.exception(
                    "could not settle a reservation of $%.6f (cost $%.6f)", self.reserved_usd, self.cost_usd
                )
                return
