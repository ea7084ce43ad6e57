"""One request's context: who asked, how it is metered, by when it must be answered.

The HTTP layer builds it once per request and hands it down explicitly to routing, resilience,
the cascade and metering.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from switchyard.billing.metering import RequestMeter
from switchyard.billing.teams import Principal, Team
from switchyard.core.errors import BudgetExceeded
from switchyard.core.estimates import estimated_cost_usd
from switchyard.core.requests import AnyRequest


@dataclass(frozen=True, slots=True)
class Deadline:
    """By when the whole request must be answered (event-loop time), and what the client hears
    when it passes."""

    ends_at: float
    reason: str

    @classmethod
    def after(cls, started_at: float, timeout_s: float | None) -> Deadline | None:
        """The request deadline `timeout_s` after `started_at` (None: no deadline)."""
        if timeout_s is None:
            return None
        return cls(started_at + timeout_s, f"request deadline of {timeout_s:g} s")


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    meter: RequestMeter
    principal: Principal | None = None
    deadline: Deadline | None = None  # computed once, from the model routing chose

    @property
    def team(self) -> Team | None:
        return self.principal.team if self.principal is not None else None

    def may_use(self, model: str) -> bool:
        """May the calling team use `model` (True when no teams are configured)."""
        return self.principal is None or self.principal.team.may_use(model)

    def with_meter(self, meter: RequestMeter) -> RequestContext:
        """The same request, metered by another meter (a cascade rung's fork)."""
        return replace(self, meter=meter)

    def worst_case_cost_usd(self, model: str, request: AnyRequest) -> float:
        return estimated_cost_usd(request, self.meter.prices.get(model))

    async def reserve_for(self, model: str, request: AnyRequest) -> bool:
        """Hold the worst-case cost of calls to `model` in the caller's budgets, once per model and
        request however often it is asked (True: it fits, or is held already)."""
        spending = self.meter.spending
        if spending is None:
            return True
        return await spending.reserve_for(model, self.worst_case_cost_usd(model, request))

    async def refusal_for(self, model: str, request: AnyRequest) -> BudgetExceeded | None:
        """Why `model`'s worst case does not fit the caller's budgets, and when to retry (None: no budgets)."""
        spending = self.meter.spending
        if spending is None or self.principal is None:
            return None
        return await spending.budgets.refusal(self.principal, (self.worst_case_cost_usd(model, request), model))
