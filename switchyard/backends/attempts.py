"""One request's way along its fallback chain, in named steps: each model in turn (`ChainRun._try`),
each attempt at it (`_attempt`), and what each kind of failure means for the next step.

The order in which the limits apply is written down in `switchyard.backends.resilience`.
Every attempt is metered once, by the run: a failure as it fails, a cancellation (the client left,
a cascade dropped the rung) when it passes through, the answer by whoever reads it to its end.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from switchyard.backends.base import AnyRequest, Pick
from switchyard.backends.breaker import AttemptTickets, Breaker
from switchyard.backends.policy import ResiliencePolicy
from switchyard.backends.registry import ModelEntry
from switchyard.core.errors import (
    AllAttemptsFailed,
    Attempt,
    BackendError,
    BackendRateLimited,
    BackendRejected,
    BackendTimeout,
    BudgetExceeded,
    CircuitOpen,
    ContextLengthExceeded,
    CoolingDown,
    DeadlinePassed,
    FirstTokenTimeout,
    Shed,
    SwitchyardError,
)
from switchyard.core.request_context import AnyContext, Deadline
from switchyard.core.tracing import child_span

T = TypeVar("T")

_MIN_FIRST_TOKEN_S = 0.05  # what is left of the first-token budget below this starts no attempt


@dataclass
class Guard:
    """The breaker(s) and the in-flight count of one deployment (a model entry). A model with
    several replicas has a breaker per replica (`replicas`, by label) and is open only when all
    of them are; its own `breaker` then stays unused."""

    entry: ModelEntry
    breaker: Breaker
    replicas: Sequence[tuple[str, Breaker]] = ()
    num_in_flight: int = 0
    num_shed: int = field(default=0)

    @property
    def breaker_state(self) -> str:
        if not self.replicas:
            return self.breaker.state
        states = {breaker.state for _, breaker in self.replicas}
        if "closed" in states:
            return "closed"
        return "open" if states == {"open"} else "half-open"

    def cooldown_left_s(self) -> float:
        """How long the model cools down after a 429 (with replicas: while every one of them does)."""
        if not self.replicas:
            return self.breaker.cooldown_left_s()
        return min(breaker.cooldown_left_s() for _, breaker in self.replicas)

    def may_answer(self) -> bool:
        """Whether a request sent now would reach an upstream (not refused by a breaker or a cooldown)."""
        if not self.replicas:
            return self.breaker.refusal() is None
        return any(breaker.refusal() is None for _, breaker in self.replicas)

    def refusal_error(self) -> SwitchyardError:
        name, left_s = self.entry.name, self.cooldown_left_s()
        if left_s > 0:
            return CoolingDown(f"{name} is cooling down after a 429 for {left_s:.1f} s more", remaining_s=left_s)
        return CircuitOpen(self.breaker.refusal() or "circuit open", backend=name, retry_after_s=1)


@dataclass(frozen=True, slots=True)
class Called(Generic[T]):
    """The attempt that answered: the model, the deployment it went to, what `call` returned, and
    its breaker tickets (settled already, unless a stream's: its reader settles them at its end)."""

    entry: ModelEntry
    deployment: str
    result: T
    tickets: AttemptTickets
    failures: tuple[Attempt, ...]  # the attempts that failed before it, in order
    num_chunks: int = 0  # of a whole answer assembled from a stream (its tokens, without the upstream's usage)


@dataclass(slots=True)
class InFlight:
    """One attempt, while it is called: where it went, and the chunks of a whole answer assembled
    so far (`num_chunks`, the call counts them): an attempt that fails is metered with them."""

    entry: ModelEntry
    deployment: str | None
    num_chunks: int = 0


# What one attempt does at a model: (the model, the deployment picked, the first-token timeout, the
# attempt in flight) -> answer.
Call = Callable[[ModelEntry, Pick, "float | None", InFlight], Awaitable[T]]


class Planner(Protocol):
    """What a run asks of the executor that plans it (`resilience.ResilientExecutor`)."""

    policy: ResiliencePolicy

    def chain(self, first: ModelEntry, ctx: AnyContext | None, needed: dict[str, str]) -> list[ModelEntry]: ...

    def guard(self, entry: ModelEntry) -> Guard: ...

    def may_go_elsewhere(self, entries: Sequence[ModelEntry]) -> bool: ...

    def first_token_timeout_s(self, entry: ModelEntry) -> float | None: ...


class ChainRun(Generic[T]):
    """The models of one request's chain tried in turn until one answers; raises AllAttemptsFailed
    (or the client's own 400) when none does."""

    def __init__(
        self,
        executor: Planner,
        first: ModelEntry,
        request: AnyRequest,
        ctx: AnyContext,
        needed: dict[str, str],
        call: Call[T],
        *,
        is_stream: bool,
    ) -> None:
        self.executor, self.policy = executor, executor.policy
        self.first, self.request, self.ctx, self.needed, self.call = first, request, ctx, needed, call
        self.is_stream = is_stream
        self.attempts: list[Attempt] = []
        self.in_flight: InFlight | None = None  # the attempt being called right now
        self.last_called: InFlight | None = None
        self.clock = asyncio.get_running_loop().time
        budget_s = self.policy.first_token_budget_s
        self.budget_ends = self.clock() + budget_s if budget_s is not None else None

    async def run(self) -> Called[T]:
        """Within the request's deadline; a cancellation meters the attempt it cut, and propagates."""
        deadline = self.ctx.deadline
        try:
            if deadline is None:
                return await self._along_chain()
            # asyncio.timeout, not wait_for: the chain runs in this task, so a cancellation that
            # reaches it is the caller's, and the timeout's own is told apart by `expired()`.
            timeout = asyncio.timeout_at(deadline.ends_at)
            try:
                async with timeout:
                    return await self._along_chain()
            except TimeoutError:
                if not timeout.expired():
                    raise
                raise self._cut_by(deadline) from None
        except asyncio.CancelledError:
            cut = self.in_flight or self.last_called
            entry, deployment = (cut.entry, cut.deployment) if cut is not None else (self.first, None)
            self.ctx.meter.finished(entry, "cancelled", None, deployment=deployment)
            raise

    def _cut_by(self, deadline: Deadline) -> AllAttemptsFailed:
        """The request's deadline passed: mid-call, a failed attempt, metered (the breakers heard a
        cancellation); between attempts (a backoff, a Retry-After), nothing was called."""
        if self.in_flight is not None:
            cut = self.in_flight
            error = DeadlinePassed(deadline.reason, backend=cut.entry.name)
            self._fail(cut.entry, error, cut.deployment, cut.num_chunks)
        else:
            self.attempts.append(Attempt(self.first.name, DeadlinePassed(deadline.reason)))
        return AllAttemptsFailed(self.attempts)

    def _fail(
        self, entry: ModelEntry, error: SwitchyardError, deployment: str | None = None, num_chunks: int = 0
    ) -> None:
        self.attempts.append(Attempt(entry.name, error))
        self.ctx.meter.failed(entry, error, deployment=deployment, num_chunks=num_chunks)

    def _fail_called(self, error: SwitchyardError) -> None:
        """The attempt just called failed: metered with what it went to and assembled."""
        called = self.last_called
        assert called is not None
        self._fail(called.entry, error, called.deployment, called.num_chunks)

    async def _along_chain(self) -> Called[T]:
        chain = self.executor.chain(self.first, self.ctx, self.needed)
        for position, entry in enumerate(chain):
            if not await self.ctx.meter.reserve_for(entry.name, self.request):
                # the caller's budgets hold the first model's worst case, not this one's: not tried
                self.attempts.append(Attempt(entry.name, BudgetExceeded("its worst-case cost does not fit the budget")))
                continue
            called = await self._try(entry, chain[position + 1 :])
            if called is not None:
                return called
        if all(isinstance(a.error, ContextLengthExceeded) for a in self.attempts):
            raise self.attempts[-1].error  # no model could hold it: the client's 400
        raise AllAttemptsFailed(self.attempts)

    async def _try(self, entry: ModelEntry, rest: Sequence[ModelEntry]) -> Called[T] | None:
        """Up to `max_attempts` attempts at `entry`; None: move on down the chain."""
        guard = self.executor.guard(entry)
        has_waited = False  # a Retry-After was just waited out: its cooldown is over
        for number in range(self.policy.max_attempts):
            first_token_s = self._first_token_s(entry)
            if self._is_shed(guard):
                return None
            tickets = self._admit(guard, has_waited)
            if tickets is None:
                return None
            has_waited = False
            pick = self._pick(guard, tickets)
            if pick is None:
                return None
            try:
                return await self._attempt(entry, guard, tickets, pick, number, first_token_s)
            except ContextLengthExceeded as exc:  # a model with a larger window may hold it
                self._fail_called(exc)
                return None
            except BackendRejected as exc:
                self._fail_called(exc)
                if len(self.attempts) == 1:
                    raise  # the client's own mistake: its status and message, as they were
                raise AllAttemptsFailed(self.attempts) from exc
            except BackendRateLimited as exc:
                if exc.retry_after_s is None and guard.cooldown_left_s() > 0:
                    exc.retry_after_s = math.ceil(guard.cooldown_left_s())  # the default cooldown's
                self._fail_called(exc)
                if number + 1 == self.policy.max_attempts:
                    return None
                if guard.replicas and guard.cooldown_left_s() == 0:
                    continue  # another replica may answer now
                pause_s = guard.cooldown_left_s()
                if pause_s > self.policy.max_retry_after_s or self.executor.may_go_elsewhere(rest):
                    return None
                await asyncio.sleep(pause_s)  # nowhere else to go: wait the Retry-After out, once
                has_waited = True
            except BackendError as exc:
                self._fail_called(exc)
                if isinstance(exc, FirstTokenTimeout):
                    return None  # a hung upstream stays hung: not asked again
                if number + 1 < self.policy.max_attempts:
                    await asyncio.sleep(self._pause_s(number, exc))
        return None

    def _first_token_s(self, entry: ModelEntry) -> float | None:
        """The attempt's first-token timeout: the model's, within what is left of the budget."""
        first_token_s = self.executor.first_token_timeout_s(entry)
        if not self.attempts or self.budget_ends is None:
            return first_token_s
        left_s = self.budget_ends - self.clock()
        if left_s < _MIN_FIRST_TOKEN_S:
            budget_s = self.policy.first_token_budget_s
            budget_spent = BackendTimeout(f"no first token within the budget of {budget_s:g} s")
            self.attempts.append(Attempt(entry.name, budget_spent))  # not called: not metered
            raise AllAttemptsFailed(self.attempts)
        return left_s if first_token_s is None else min(first_token_s, left_s)

    def _is_shed(self, guard: Guard) -> bool:
        limit = self.policy.max_in_flight
        if limit is None or guard.num_in_flight < limit:
            return False
        guard.num_shed += 1
        self._fail(guard.entry, Shed(f"over {limit} requests in flight", retry_after_s=1))
        return True

    def _admit(self, guard: Guard, has_waited: bool) -> AttemptTickets | None:
        """The model's breaker ticket (a model with replicas: its replica's comes with the pick);
        None, metered as a refusal, when its breaker or a 429 cooldown keeps it from being called."""
        tickets = AttemptTickets()
        if not guard.replicas:
            ticket = guard.breaker.admit(ignore_cooldown=has_waited)
            if ticket is None:
                self._fail(guard.entry, guard.refusal_error())
                return None
            tickets.add(ticket)
        elif guard.cooldown_left_s() > 0 and not has_waited:
            self._fail(guard.entry, guard.refusal_error())
            return None
        return tickets

    def _pick(self, guard: Guard, tickets: AttemptTickets) -> Pick | None:
        """The deployment to call (a replica its breaker admits, whose ticket joins the attempt's);
        None, metered as a refusal, when every replica is open or cooling down."""
        try:
            pick = guard.entry.backend.pick(self.request, use_breakers=bool(guard.replicas))
        except (CircuitOpen, CoolingDown) as exc:
            self._fail(guard.entry, exc)
            return None
        if pick.ticket is not None:
            tickets.add(pick.ticket)
        return pick

    async def _attempt(
        self,
        entry: ModelEntry,
        guard: Guard,
        tickets: AttemptTickets,
        pick: Pick,
        number: int,
        first_token_s: float | None,
    ) -> Called[T]:
        """One call to the deployment picked."""
        guard.num_in_flight += 1
        self.ctx.meter.begin_attempt()
        try:
            attempt = self.in_flight = self.last_called = InFlight(entry, pick.label)
            try:
                with child_span("backend attempt", model=entry.name, attempt=number + 1):
                    result = await self.call(entry, pick, first_token_s, attempt)
            except BaseException as exc:
                tickets.settle(exc)  # the deadline's cancellation: neutral for the breakers
                if not isinstance(exc, asyncio.CancelledError):
                    self.in_flight = None  # a cancellation (the deadline's) leaves it for the meter
                raise
            self.in_flight = None
            if not self.is_stream:
                tickets.settle(None)
            deployment = pick.label or entry.backend_kind
            return Called(entry, deployment, result, tickets, tuple(self.attempts), attempt.num_chunks)
        finally:
            guard.num_in_flight -= 1

    def _pause_s(self, number: int, exc: BackendError) -> float:
        if exc.retry_after_s is not None and exc.retry_after_s <= self.policy.max_retry_after_s:
            return exc.retry_after_s
        return random.uniform(0, min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2**number))
