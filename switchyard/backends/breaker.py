"""The circuit breaker, used at both levels: per model, and per replica where a model has several.

    closed ──(breaker_fail_max failures in a row)──▶ open ──(breaker_reset_s)──▶ half-open
      ▲                                                ▲                            │
      └──────────────(the trial succeeds)──────────────┼────(the trial fails)───────┘

Half-open admits exactly one trial request; the others are refused until it ends. Only the
upstream's own trouble counts as a failure (5xx, timeouts, connection errors, a stream that
breaks after its first byte): never a client's 4xx, never a 429, never a caller that went away,
never a call cut by our own deadline (the request's or the attempt's), never a parameter the
model cannot take (refused before the call).
An upstream's 429 instead starts a cooldown, apart from the state: no request is admitted until
its `Retry-After` (capped) has passed, and the cooldown never counts as a failure.

Each attempt takes a `Ticket` from every breaker it passes (the model's, the replica's) and
settles them all with its outcome in one place (`AttemptTickets.settle`): the executor takes the
model's, and the replica's comes with the backend's `pick()` of a replica. A stream's tickets are
settled when the stream ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import (
    BackendError,
    BackendRateLimited,
    BackendRejected,
    CircuitOpen,
    CoolingDown,
    DeadlinePassed,
    SwitchyardError,
    UnsupportedParameter,
)


def is_breaker_failure(exc: BaseException) -> bool:
    """Only the upstream's own trouble trips a breaker: not a client's bad request, and not a rate
    limit (the upstream is healthy, only busy), nor a refusal or a deadline of our own."""
    return isinstance(exc, BackendError) and not isinstance(
        exc, BackendRejected | BackendRateLimited | CircuitOpen | DeadlinePassed
    )


def _is_answer(exc: BaseException) -> bool:
    """The upstream answered, if with an error (a client's 4xx): not our refusal (an open circuit, a
    parameter refused before the call), our deadline, a cancellation, nor an exception of our own
    (a bug says nothing about the upstream)."""
    return isinstance(exc, SwitchyardError) and not isinstance(
        exc, CircuitOpen | CoolingDown | DeadlinePassed | UnsupportedParameter
    )


def is_upstream_rate_limit(exc: BaseException) -> bool:
    """The upstream's own 429, as opposed to one of ours (shedding, a cooldown)."""
    return isinstance(exc, BackendRateLimited) and exc.code == BackendRateLimited.code


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    fail_max: int = 5
    reset_s: float = 30.0
    max_cooldown_s: float = 60.0  # a longer Retry-After cools down this long
    default_cooldown_s: float = 1.0  # a 429 without Retry-After


@dataclass(eq=False, slots=True)
class Breaker:
    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    clock: Callable[[], float] = time.monotonic
    num_failures: int = 0
    opened_at: float | None = None
    trial: Ticket | None = None  # half-open: the one request let through to test the upstream
    trial_started_at: float = 0.0
    cooling_until: float = 0.0

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.policy.reset_s else "open"

    def cooldown_left_s(self) -> float:
        return max(0.0, self.cooling_until - self.clock())

    def refusal(self) -> str | None:
        """Why no request may go through now (None: one may)."""
        if self.cooldown_left_s() > 0:
            return "cooling down after a 429"
        return self.state_refusal()

    def state_refusal(self) -> str | None:
        state = self.state
        if state == "open":
            return "circuit open"
        if state == "half-open" and self.trial is not None and not self._is_trial_lost():
            return "circuit half-open: one trial request is in flight"
        return None

    def admit(self, *, ignore_cooldown: bool = False) -> Ticket | None:
        """A ticket for one request, or None when it may not go (`ignore_cooldown`: its caller waited
        the cooldown out already, up to the clock's resolution)."""
        if self.refusal() is not None and not (ignore_cooldown and self.state_refusal() is None):
            return None
        ticket = Ticket(self, is_trial=self.state == "half-open")
        if ticket.is_trial:
            self.trial, self.trial_started_at = ticket, self.clock()
        return ticket

    def _is_trial_lost(self) -> bool:
        """A trial never settled (a stream nobody closed) must not keep the breaker shut for good:
        after another `reset_s` the next request is the trial."""
        return self.clock() - self.trial_started_at >= self.policy.reset_s

    def cool_down(self, retry_after_s: float | None) -> None:
        seconds = self.policy.default_cooldown_s if retry_after_s is None else retry_after_s
        self.cooling_until = max(self.cooling_until, self.clock() + min(seconds, self.policy.max_cooldown_s))

    def _record(self, ticket: Ticket, outcome: BaseException | None) -> None:
        if ticket is self.trial:
            self.trial = None
        if outcome is not None and is_upstream_rate_limit(outcome):
            self.cool_down(outcome.retry_after_s)  # type: ignore[attr-defined]
        elif outcome is not None and is_breaker_failure(outcome):
            self.num_failures += 1
            if ticket.is_trial or self.num_failures >= self.policy.fail_max:
                self.opened_at = self.clock()
        elif outcome is None or _is_answer(outcome):
            # the upstream answered (a client's 4xx is an answer too)
            if ticket.is_trial or self.opened_at is None:
                self.num_failures, self.opened_at = 0, None
        # otherwise the caller was cancelled, closed the stream or ran out of time: that says nothing
        # about the upstream


@dataclass(eq=False, slots=True)
class Ticket:
    breaker: Breaker
    is_trial: bool
    is_settled: bool = False

    def settle(self, outcome: BaseException | None) -> None:
        if not self.is_settled:
            self.is_settled = True
            self.breaker._record(self, outcome)


@dataclass(eq=False, slots=True)
class AttemptTickets:
    """The tickets one attempt holds; `settle` is idempotent."""

    tickets: list[Ticket] = field(default_factory=list)

    def add(self, ticket: Ticket) -> None:
        self.tickets.append(ticket)

    def settle(self, outcome: BaseException | None) -> None:
        for ticket in self.tickets:
            ticket.settle(outcome)


class SettlingStream:
    """The rest of a stream; settles the attempt's tickets when it ends: a clean end is a success,
    an error raised while reading is the outcome, and `aclose()` before the end (the reader left)
    settles nothing but the trial."""

    def __init__(self, chunks: AsyncIterator[StreamChunk], tickets: AttemptTickets) -> None:
        self.chunks, self.tickets = chunks, tickets

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamChunk:
        try:
            return await anext(self.chunks)
        except StopAsyncIteration:
            self.tickets.settle(None)
            raise
        except BaseException as exc:
            self.tickets.settle(exc)
            raise

    async def aclose(self) -> None:
        self.tickets.settle(asyncio.CancelledError())
        await self.chunks.aclose()  # type: ignore[attr-defined]
