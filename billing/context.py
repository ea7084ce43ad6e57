"""One request's context: who asked, how it is metered, by when it must be answered.

The HTTP layer builds it once per request and hands it down explicitly to routing, resilience,
the cascade and metering.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from switchyard.billing.metering import RequestMeter
from switchyard.billing.teams import Team


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    meter: RequestMeter
    team: Team | None = None
    deadline: float | None = None  # event-loop time by which the whole request must be answered

    def may_use(self, model: str) -> bool:
        """May the calling team use `model` (True when no teams are configured)."""
        return self.team is None or self.team.may_use(model)

    def remaining_s(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def with_meter(self, meter: RequestMeter) -> RequestContext:
        """The same request, metered by another meter (a cascade rung's fork)."""
        return replace(self, meter=meter)
