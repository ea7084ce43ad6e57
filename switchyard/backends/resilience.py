"""Resilience around every backend call, applied in this order (like TensorZero's, written down):

1. fallback chain: the requested model, then each of its `fallbacks` (that the team may use, and
   that have every capability the request needs: `core.capabilities.needs`), in order;
2. per model, load shedding: more than `max_in_flight` requests in flight → skip it (429 if all do);
3. per model, the circuit breaker (`switchyard.backends.breaker`), and per replica where a model
   has several (the balancer chooses only among the replicas it admits; the model is open only
   when all are): open → skip it without calling; half-open → exactly one trial request goes
   through; only the upstream's failures count (5xx, timeouts, connection errors, a stream that
   breaks after its first byte), never a client's 4xx, a client that leaves, nor a 429;
4. per model (or replica), a 429 cooldown: an upstream's 429 rests it for its `Retry-After` (at
   most `max_cooldown_s`); a cooling model is skipped without calling it, a cooling replica is not
   chosen. When nothing further down the chain can answer and the `Retry-After` is at most
   `max_retry_after_s`, it is waited out once and the model tried again; otherwise the chain moves
   on, and when it ends the client hears 429 with the cooldown's remaining `Retry-After` (also
   when the other models' circuits are open: only the cooldown kept the request from an answer);
5. per model, up to `max_attempts` attempts with exponential backoff and full jitter, honouring
   `Retry-After` on 503 (up to `max_retry_after_s`); only before the first streamed byte; a
   first-token timeout is not retried on the same model (a hung upstream stays hung): the chain
   moves on, and no attempt starts once `first_token_budget_s` has passed without a first token;
6. per attempt, timeouts: connect and read (the HTTP session), time to first token
   (`first_token_timeout_s`, the model's own when set), and the whole attempt (`attempt_timeout_s`);
   a non-stream request is asked of the upstream as a stream and its answer assembled
   (backends/assemble.py), so that the first-token timeout guards it too;
7. over everything, the request's deadline (`request_timeout_s`, the first model's own when set);
   a stream past it ends in-band. A call cut by it (or a stream by `attempt_timeout_s`) is metered
   as a failed attempt but is neutral for the breakers (`DeadlinePassed`): the upstream was not at
   fault; one that stalls is caught by the first-token and stream idle timeouts, which count.

Errors that retrying cannot fix (the upstream's 4xx: bad request, content policy) end the chain at
once; a context-length error skips to the next fallback. When every attempt fails, one
`AllAttemptsFailed` lists each attempt: 429 if all were rate limits, otherwise 503/504/502 —
never 500.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.base import AnyRequest
from switchyard.backends.breaker import (
    AttemptTickets,
    Breaker,
    BreakerPolicy,
    CircuitOpen,
    CoolingDown,
    DeadlinePassed,
    SettlingStream,
    current_attempt,
)
from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.backends.waiting import Held, WaitingTokens
from switchyard.billing.context import RequestContext
from switchyard.billing.metering import RequestMeter
from switchyard.core.capabilities import needs
from switchyard.core.errors import (
    BackendError,
    BackendRateLimited,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    BudgetExceeded,
    ContextLengthExceeded,
    SwitchyardError,
)
from switchyard.core.estimates import worst_case_tokens
from switchyard.core.protocol import CompletionResult, StreamChunk
from switchyard.core.tracing import child_span

logger = logging.getLogger("switchyard.resilience")


@dataclass(frozen=True, slots=True)
class ResiliencePolicy:
    max_attempts: int = 2
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    max_retry_after_s: float = 5.0
    first_token_timeout_s: float | None = 20.0
    first_token_budget_s: float | None = 45.0
    attempt_timeout_s: float | None = None
    request_timeout_s: float | None = 600.0
    breaker_fail_max: int = 5
    breaker_reset_s: float = 30.0
    max_cooldown_s: float = 60.0
    default_cooldown_s: float = 1.0
    max_in_flight: int | None = None
    saturation_wait_s: float = 10.0
    saturation_max_waiting: int = 64


@dataclass(slots=True)
class Attempt:
    model: str
    error: SwitchyardError

    def describe(self, *, for_log: bool = False) -> str:
        text = self.error.log_message if for_log else self.error.message
        return f"{self.model}: {self.error.status_code} {text}"


class AllAttemptsFailed(BackendError):
    """Every model in the chain failed; `attempts` keeps each failure in order."""

    def __init__(self, attempts: list[Attempt]) -> None:
        kinds = {type(a.error) for a in attempts if not isinstance(a.error, BudgetExceeded)}
        limited = [a for a in attempts if isinstance(a.error, BackendRateLimited)]
        if limited and all(issubclass(k, BackendRateLimited | CircuitOpen) for k in kinds):
            # nothing answered only for rate limits (an open circuit aside): back when a cooldown ends
            status, code = 429, "rate_limit_exceeded"
        elif kinds and all(issubclass(k, BackendTimeout) for k in kinds):
            status, code = 504, "upstream_timeout"
        elif kinds and all(issubclass(k, BackendUnavailable | BackendTimeout) for k in kinds):
            status, code = 503, "upstream_unavailable"
        else:
            status, code = 502, "upstream_error"
        waits = limited if status == 429 else attempts
        retry_after = [a.error.retry_after_s for a in waits if a.error.retry_after_s is not None]
        heading = f"All {len(attempts)} attempts failed: "
        message = heading + "; ".join(a.describe() for a in attempts)
        detail = heading + "; ".join(a.describe(for_log=True) for a in attempts)
        super().__init__(message, code=code, retry_after_s=min(retry_after) if retry_after else None, detail=detail)
        self.status_code = status
        self.error_type = "rate_limit_error" if status == 429 else "upstream_error"
        self.attempts = attempts


class _Shed(BackendRateLimited):
    code = "load_shed"


_MIN_FIRST_TOKEN_S = 0.05  # what is left of the first-token budget below this starts no attempt


class _FirstTokenTimeout(BackendTimeout):
    """No first token in time: the model is not asked again within this request."""


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


class ResilientExecutor:
    def __init__(self, registry: ModelRegistry, fallbacks: dict[str, list[str]], policy: ResiliencePolicy) -> None:
        self.registry = registry
        self.fallbacks = fallbacks
        self.policy = policy
        self.breaker_policy = BreakerPolicy(
            policy.breaker_fail_max, policy.breaker_reset_s, policy.max_cooldown_s, policy.default_cooldown_s
        )
        self.guards: dict[str, Guard] = {}
        self.waiting = WaitingTokens()  # tokens sent to each model that have no first token yet
        for entry in registry:
            self.guard(entry)

    def guard(self, entry: ModelEntry) -> Guard:
        guard = self.guards.get(entry.name)
        if guard is None:
            replicas = entry.backend.attach_breakers(lambda: Breaker(self.breaker_policy))
            guard = self.guards[entry.name] = Guard(entry, Breaker(self.breaker_policy), replicas)
        return guard

    def chain(
        self, first: ModelEntry, ctx: RequestContext | None = None, needed: dict[str, str] | None = None
    ) -> list[ModelEntry]:
        """The model, then its fallbacks that the calling team may use and that can serve a request
        needing `needed` (the first model was chosen able to)."""
        names = [name for name in self.fallbacks.get(first.name, ()) if ctx is None or ctx.may_use(name)]
        fallbacks = [self.registry.get(name) for name in names]
        return [first, *(entry for entry in fallbacks if not entry.capabilities.lacks(needed or {}))]

    # -- the two entry points ------------------------------------------------------------------

    def first_token_timeout_s(self, entry: ModelEntry) -> float | None:
        own = entry.first_token_timeout_s
        return own if own is not None else self.policy.first_token_timeout_s

    def request_timeout_s(self, entry: ModelEntry) -> float | None:
        """The deadline of a request that `entry` answers first (the HTTP layer sets it from here)."""
        own = entry.request_timeout_s
        return own if own is not None else self.policy.request_timeout_s

    async def complete(
        self,
        first: ModelEntry,
        request: AnyRequest,
        ctx: RequestContext | None = None,
        needed: dict[str, str] | None = None,
    ) -> tuple[ModelEntry, CompletionResult]:
        """`needed`: what a fallback must be able to do; by default what `request` needs (the
        cascade passes the client's needs, not those of the logprobs it asks a judged rung for)."""

        async def call(entry: ModelEntry, first_token_s: float | None) -> CompletionResult:
            with self.waiting.hold(entry.name, worst_case_tokens(request)) as held:
                if entry.assemble_from_stream and _can_stream(request):
                    meter = ctx.meter if ctx is not None else None
                    answer = self._assembled(entry, request, first_token_s, meter, held)
                else:
                    answer = entry.backend.complete(request)
                return await _within(answer, self.policy.attempt_timeout_s, entry.name, "answer")

        entry, result, _ = await self._run(first, call, ctx, request, self._deadline(first, ctx), needed)
        return entry, result

    async def _assembled(
        self,
        entry: ModelEntry,
        request: AnyRequest,
        first_token_s: float | None,
        meter: RequestMeter | None,
        held: Held,
    ) -> CompletionResult:
        """The meter counts the chunks (an answer without usage, or cut short, is estimated from
        them) and notes the first one's time: a whole answer assembled has a time to first token."""
        chunks = entry.backend.stream(request)
        assembler = AnswerAssembler(entry.name)
        try:
            chunk = await _first_chunk(chunks, first_token_s, entry.name)
            held.release()
            if meter is not None and chunk is not None:
                meter.first_token()
            while chunk is not None:
                assembler.add(chunk)
                if meter is not None:
                    meter.num_chunks = assembler.num_chunks
                chunk = await anext(chunks, None)
        finally:
            await chunks.aclose()
        return assembler.result()

    async def stream(
        self,
        first: ModelEntry,
        request: AnyRequest,
        ctx: RequestContext | None = None,
        needed: dict[str, str] | None = None,
    ) -> tuple[ModelEntry, StreamChunk | None, AsyncIterator[StreamChunk]]:
        """Open a stream and wait for its first chunk: everything before that byte may be retried.
        The breakers hear how the stream ends: a failure after the first byte counts too.
        `needed`: as for `complete()`."""

        async def call(entry: ModelEntry, first_token_s: float | None):
            chunks = entry.backend.stream(request)
            try:
                with self.waiting.hold(entry.name, worst_case_tokens(request)):
                    first_chunk = await _first_chunk(chunks, first_token_s, entry.name)
            except BaseException:
                await chunks.aclose()
                raise
            if ctx is not None and first_chunk is not None:
                ctx.meter.first_token()
            return first_chunk, chunks

        deadline = self._deadline(first, ctx)
        entry, (first_chunk, rest), tickets = await self._run(
            first, call, ctx, request, deadline, needed, is_stream=True
        )
        if first_chunk is None:
            tickets.settle(None)  # an empty stream, complete
        attempt_s = self.policy.attempt_timeout_s
        if attempt_s is not None:
            attempt_ends = asyncio.get_running_loop().time() + attempt_s
            if deadline is None or attempt_ends < deadline.ends_at:
                deadline = _Deadline(attempt_ends, f"{entry.name}: the answer took longer than {attempt_s:g} s")
        if deadline is not None:
            rest = _DeadlineStream(rest, deadline, entry.name)
        return entry, first_chunk, SettlingStream(rest, tickets)

    def _deadline(self, first: ModelEntry, ctx: RequestContext | None) -> _Deadline | None:
        """The request's: the HTTP layer's (in `ctx`), else the first model's timeout from now."""
        timeout_s = self.request_timeout_s(first)
        reason = f"request deadline of {timeout_s:g} s" if timeout_s is not None else "request deadline"
        if ctx is not None and ctx.deadline is not None:
            return _Deadline(ctx.deadline, reason)
        if timeout_s is None:
            return None
        return _Deadline(asyncio.get_running_loop().time() + timeout_s, reason)

    # -- the loop -------------------------------------------------------------------------------

    async def _run(
        self,
        first: ModelEntry,
        call,
        ctx: RequestContext | None,
        request: AnyRequest,
        deadline: _Deadline | None,
        needed: dict[str, str] | None = None,
        is_stream: bool = False,
    ):
        """Returns the model that answered, its answer, and the attempt's breaker tickets (settled
        already, unless a stream's: its reader settles them when it ends)."""
        attempts: list[Attempt] = []
        meter = ctx.meter if ctx is not None else None
        clock = asyncio.get_running_loop().time
        budget_s = self.policy.first_token_budget_s
        budget_ends = clock() + budget_s if budget_s is not None else None

        calling: list[ModelEntry] = []  # the model being called right now, if any

        def fail(entry: ModelEntry, error: SwitchyardError) -> None:
            attempts.append(Attempt(entry.name, error))
            if meter is not None:
                meter.failed(entry, error)

        async def loop():
            chain = self.chain(first, ctx, needs(request) if needed is None else needed)
            for position, entry in enumerate(chain):
                if entry is not first and ctx is not None and not await ctx.reserve_for(entry.name, request):
                    # the caller's budgets hold the first model's worst case, not this one's: not tried
                    attempts.append(Attempt(entry.name, BudgetExceeded("its worst-case cost does not fit the budget")))
                    continue
                guard = self.guard(entry)
                has_waited = False  # a Retry-After was just waited out: its cooldown is over
                for number in range(self.policy.max_attempts):
                    first_token_s = self.first_token_timeout_s(entry)
                    if attempts and budget_ends is not None:
                        left_s = budget_ends - clock()
                        if left_s < _MIN_FIRST_TOKEN_S:
                            budget_spent = BackendTimeout(f"no first token within the budget of {budget_s:g} s")
                            attempts.append(Attempt(entry.name, budget_spent))  # not called: not metered
                            raise AllAttemptsFailed(attempts)
                        first_token_s = left_s if first_token_s is None else min(first_token_s, left_s)
                    if self.policy.max_in_flight is not None and guard.num_in_flight >= self.policy.max_in_flight:
                        guard.num_shed += 1
                        fail(entry, _Shed(f"over {self.policy.max_in_flight} requests in flight", retry_after_s=1))
                        break
                    tickets = AttemptTickets()
                    if not guard.replicas:
                        ticket = guard.breaker.admit(ignore_cooldown=has_waited)
                        if ticket is None:
                            fail(entry, guard.refusal_error())
                            break
                        tickets.add(ticket)
                    elif guard.cooldown_left_s() > 0 and not has_waited:
                        fail(entry, guard.refusal_error())
                        break
                    has_waited = False
                    guard.num_in_flight += 1
                    if meter is not None:
                        meter.begin_attempt()
                        meter.current_entry = entry
                    token = current_attempt.set(tickets)  # a backend with replicas adds its chosen one's
                    calling.append(entry)
                    try:
                        try:
                            with child_span("backend attempt", model=entry.name, attempt=number + 1):
                                result = await call(entry, first_token_s)
                        except BaseException as exc:
                            tickets.settle(exc)  # the deadline's cancellation: neutral for the breakers
                            if not isinstance(exc, asyncio.CancelledError):
                                calling.clear()  # a cancellation (the deadline's) leaves it for the meter
                            raise
                        calling.clear()
                        if not is_stream:
                            tickets.settle(None)
                        return entry, result, tickets
                    except (CircuitOpen, CoolingDown) as exc:  # every replica refused it: not called
                        fail(entry, exc)
                        break
                    except ContextLengthExceeded as exc:
                        fail(entry, exc)
                        break
                    except BackendRejected as exc:
                        fail(entry, exc)
                        if len(attempts) == 1:
                            raise  # the client's own mistake: its status and message, as they were
                        raise AllAttemptsFailed(attempts) from exc
                    except BackendRateLimited as exc:
                        if exc.retry_after_s is None and guard.cooldown_left_s() > 0:
                            exc.retry_after_s = math.ceil(guard.cooldown_left_s())  # the default cooldown's
                        fail(entry, exc)
                        if number + 1 == self.policy.max_attempts:
                            break
                        if guard.replicas and guard.cooldown_left_s() == 0:
                            continue  # another replica may answer now
                        pause_s = guard.cooldown_left_s()
                        if pause_s > self.policy.max_retry_after_s or self._may_go_elsewhere(chain[position + 1 :]):
                            break
                        await asyncio.sleep(pause_s)  # nowhere else to go: wait the Retry-After out, once
                        has_waited = True
                    except BackendError as exc:
                        fail(entry, exc)
                        if isinstance(exc, _FirstTokenTimeout):
                            break
                        if number + 1 < self.policy.max_attempts:
                            await asyncio.sleep(self._pause_s(number, exc))
                    finally:
                        current_attempt.reset(token)
                        guard.num_in_flight -= 1
            if all(isinstance(a.error, ContextLengthExceeded) for a in attempts):
                raise attempts[-1].error  # no model could hold it: the client's 400
            raise AllAttemptsFailed(attempts)

        if deadline is None:
            return await loop()
        # asyncio.timeout, not wait_for: the loop runs in this task, so what it sets in context
        # variables (which replica answered) stays visible to the caller.
        timeout = asyncio.timeout_at(deadline.ends_at)
        try:
            async with timeout:
                return await loop()
        except TimeoutError:
            if not timeout.expired():
                raise
            if calling:  # cut mid-call: a failed attempt, metered (the breakers heard a cancellation)
                fail(calling[0], DeadlinePassed(deadline.reason, backend=calling[0].name))
            else:  # between attempts (a backoff, a Retry-After): nothing was called
                attempts.append(Attempt(first.name, DeadlinePassed(deadline.reason)))
            raise AllAttemptsFailed(attempts) from None

    def _may_go_elsewhere(self, entries: Sequence[ModelEntry]) -> bool:
        return any(self.guard(entry).may_answer() for entry in entries)

    def _pause_s(self, number: int, exc: BackendError) -> float:
        if exc.retry_after_s is not None and exc.retry_after_s <= self.policy.max_retry_after_s:
            return exc.retry_after_s
        return random.uniform(0, min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2**number))

    def states(self) -> dict[str, str]:
        """Each model's breaker: closed, open or half-open (with replicas: open only when all are)."""
        return {name: guard.breaker_state for name, guard in self.guards.items()}

    def replica_states(self) -> dict[str, dict[str, str]]:
        """The breaker of each replica, by label, of the models that have several."""
        return {
            name: {label: breaker.state for label, breaker in guard.replicas}
            for name, guard in self.guards.items()
            if guard.replicas
        }

    def cooldowns(self) -> dict[str, float]:
        """Seconds left of each 429 cooldown: by model, or `model/replica` for a replica's."""
        left: dict[str, float] = {}
        for name, guard in self.guards.items():
            pairs = [(f"{name}/{label}", b) for label, b in guard.replicas] or [(name, guard.breaker)]
            left |= {key: round(b.cooldown_left_s(), 1) for key, b in pairs if b.cooldown_left_s() > 0}
        return left


@dataclass(frozen=True, slots=True)
class _Deadline:
    ends_at: float  # event-loop time
    reason: str  # what the client hears when it passes


class _DeadlineStream:
    """The rest of a stream, cut with DeadlinePassed (an in-band error; neutral for the breakers)
    once its deadline passes (the attempt's or the request's, whichever comes first).

    One timer for the whole stream, not a timeout per chunk (that would cost more than relaying the
    chunk): when it fires while a chunk is awaited, it cancels the awaiting task, and the
    cancellation becomes the timeout here, as `asyncio.timeout` does; a cancellation from anyone
    else propagates.

    A class, not an async generator: `aclose()` must close the upstream stream even when nobody
    ever iterated this (a client gone before the body started); an unstarted generator's
    `finally` never runs.
    """

    def __init__(self, chunks: AsyncIterator[StreamChunk], deadline: _Deadline, model: str) -> None:
        self.chunks, self.deadline, self.model = chunks, deadline, model
        self._is_expired = self._has_cancelled = False
        self._waiter: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_at(deadline.ends_at, self._expire)

    def _expire(self) -> None:
        self._is_expired = True
        if self._waiter is not None:
            self._has_cancelled = True
            self._waiter.cancel()

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamChunk:
        if self._is_expired:
            raise await self._timed_out()
        task = asyncio.current_task()
        assert task is not None
        self._waiter, cancelling = task, task.cancelling()
        try:
            return await anext(self.chunks)
        except asyncio.CancelledError:
            if self._has_cancelled and task.uncancel() <= cancelling:
                raise await self._timed_out() from None
            raise
        except StopAsyncIteration:
            self._timer.cancel()
            raise
        finally:
            self._waiter = None

    async def _timed_out(self) -> DeadlinePassed:
        await self.chunks.aclose()
        return DeadlinePassed(self.deadline.reason, backend=self.model)

    async def aclose(self) -> None:
        self._timer.cancel()
        await self.chunks.aclose()


def _can_stream(request: AnyRequest) -> bool:
    """OpenAI's API refuses to stream a legacy completion with `best_of` (vLLM: beam search too)."""
    payload = request.wire_payload()
    return payload.get("best_of") in (None, 1) and not payload.get("use_beam_search")


async def _first_chunk(chunks: AsyncIterator[StreamChunk], timeout_s: float | None, model: str) -> StreamChunk | None:
    if timeout_s is None:
        return await anext(chunks, None)
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await anext(chunks, None)
    except TimeoutError:
        if not timeout.expired():
            raise
        raise _FirstTokenTimeout(f"{model}: no first token within {timeout_s:.3g} s", backend=model) from None


async def _within(awaitable, timeout_s: float | None, model: str, what: str):
    if timeout_s is None:
        return await awaitable
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await awaitable
    except TimeoutError:
        if not timeout.expired():
            raise
        raise BackendTimeout(f"{model}: no {what} within {timeout_s:g} s", backend=model) from None
