"""One request's context: who asked, how it is metered, by when it must be answered.

The gateway builds it once per request and hands it down explicitly to routing, resilience, the
cascade and metering. It is generic in who asked and in the meter, so that those below the
gateway (backends, cascade) see only the protocols they need (`Caller`, `AttemptMeter`) while the
gateway keeps billing's own types (`billing.teams.Principal`, `billing.metering.RequestMeter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from switchyard.core.metering import AttemptMeter


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


class Team(Protocol):
    """What routing asks of the calling team (`switchyard.billing.teams.Team`)."""

    @property
    def name(self) -> str: ...

    def may_use(self, model: str) -> bool: ...


TeamT = TypeVar("TeamT", bound=Team)
TeamT_co = TypeVar("TeamT_co", bound=Team, covariant=True)


class Caller(Protocol[TeamT_co]):
    """Who asked (`switchyard.billing.teams.Principal`): its team."""

    @property
    def team(self) -> TeamT_co: ...


CallerT_co = TypeVar("CallerT_co", bound=Caller[Team], covariant=True)
MeterT_co = TypeVar("MeterT_co", bound=AttemptMeter, covariant=True)
MeterT = TypeVar("MeterT", bound=AttemptMeter)


@dataclass(frozen=True, slots=True)
class RequestContext(Generic[CallerT_co, MeterT_co]):
    request_id: str
    meter: MeterT_co
    principal: CallerT_co | None = None
    deadline: Deadline | None = None  # computed once, from the model routing chose

    @property
    def team(self: RequestContext[Caller[TeamT], Any]) -> TeamT | None:
        return self.principal.team if self.principal is not None else None

    def may_use(self, model: str) -> bool:
        """May the calling team use `model` (True when no teams are configured)."""
        return self.principal is None or self.principal.team.may_use(model)

    def with_meter(self, meter: MeterT) -> RequestContext[CallerT_co, MeterT]:
        """The same request, metered by another meter (a cascade rung's fork)."""
        return RequestContext(self.request_id, meter, self.principal, self.deadline)


# What the backends and the cascade take: any caller, any meter.
AnyContext = RequestContext[Caller[Team], AttemptMeter]
