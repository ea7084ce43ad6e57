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
   (`Backend.complete_from_stream`, backends/assemble.py), so that the first-token and stream idle
   timeouts guard it too, unless its model sets `assemble_from_stream: false`;
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
from collections.abc import AsyncIterator, Sequence

from switchyard.backends.answered import Answered
from switchyard.backends.attempts import ChainRun, Guard, InFlight
from switchyard.backends.base import AnyRequest, Pick
from switchyard.backends.breaker import Breaker, BreakerPolicy, SettlingStream
from switchyard.backends.deadlines import DeadlineStream, first_chunk, within
from switchyard.backends.policy import ResiliencePolicy
from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.backends.waiting import Held, WaitingTokens
from switchyard.core.chat_wire import CompletionResult, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import AllAttemptsFailed, Attempt, FirstTokenTimeout
from switchyard.core.estimates import worst_case_tokens
from switchyard.core.metering import AttemptMeter
from switchyard.core.request_context import AnyContext, Deadline

__all__ = ["AllAttemptsFailed", "Answered", "Attempt", "ResiliencePolicy", "ResilientExecutor"]


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

    def chain(self, first: ModelEntry, ctx: AnyContext | None, needed: dict[str, str]) -> list[ModelEntry]:
        """The model, then its fallbacks that the calling team may use (any, without `ctx`) and that
        can serve a request needing `needed` (the first model was chosen able to)."""
        names = [name for name in self.fallbacks.get(first.name, ()) if ctx is None or ctx.may_use(name)]
        fallbacks = [self.registry.get(name) for name in names]
        return [first, *(entry for entry in fallbacks if not entry.capabilities.lacks(needed))]

    def may_go_elsewhere(self, entries: Sequence[ModelEntry]) -> bool:
        return any(self.guard(entry).may_answer() for entry in entries)

    def first_token_timeout_s(self, entry: ModelEntry) -> float | None:
        own = entry.first_token_timeout_s
        return own if own is not None else self.policy.first_token_timeout_s

    def request_timeout_s(self, entry: ModelEntry) -> float | None:
        """The deadline of a request that `entry` answers first (the HTTP layer sets it from here)."""
        own = entry.request_timeout_s
        return own if own is not None else self.policy.request_timeout_s

    # -- the two entry points ------------------------------------------------------------------

    async def complete(
        self, first: ModelEntry, request: AnyRequest, ctx: AnyContext, needed: dict[str, str]
    ) -> Answered:
        """A whole answer from `first` or a fallback that can serve what the client's request
        `needed` (the cascade asks a judged rung for logprobs the client did not: not a need)."""
        num_tokens = worst_case_tokens(request)

        async def call(
            entry: ModelEntry, pick: Pick, first_token_s: float | None, attempt: InFlight
        ) -> CompletionResult:
            with self.waiting.hold(entry.name, num_tokens) as held:
                if entry.assemble_from_stream and _can_stream(request):
                    answer = self._assembled(entry, request, pick, first_token_s, ctx.meter, attempt, held)
                else:
                    answer = entry.backend.complete(request, pick)
                return await within(answer, self.policy.attempt_timeout_s, entry.name, "answer")

        called = await ChainRun(self, first, request, ctx, needed, call, is_stream=False).run()
        return Answered(
            called.entry, called.deployment, called.result, num_chunks=called.num_chunks, failures=called.failures
        )

    async def _assembled(
        self,
        entry: ModelEntry,
        request: AnyRequest,
        pick: Pick,
        first_token_s: float | None,
        meter: AttemptMeter,
        attempt: InFlight,
        held: Held,
    ) -> CompletionResult:
        """One timer bounds the wait for the first event and is lifted when it comes; the meter
        notes that time (a whole answer assembled has a time to first token), and the attempt counts
        the events (an answer without usage, or cut short, is metered from them)."""
        timeout = asyncio.timeout(first_token_s)
        progress = _Progress(timeout, meter, attempt, held)
        try:
            async with timeout:
                return await entry.backend.complete_from_stream(request, pick, progress)
        except TimeoutError:
            if not timeout.expired():
                raise
            message = f"{entry.name}: no first token within {first_token_s:.3g} s"
            raise FirstTokenTimeout(message, backend=entry.name) from None

    async def stream(self, first: ModelEntry, request: AnyRequest, ctx: AnyContext, needed: dict[str, str]) -> Answered:
        """Open a stream and wait for its first chunk: everything before that byte may be retried.
        The breakers hear how the stream ends: a failure after the first byte counts too.
        `needed`: as for `complete()`."""
        num_tokens = worst_case_tokens(request)

        async def call(
            entry: ModelEntry, pick: Pick, first_token_s: float | None, attempt: InFlight
        ) -> tuple[StreamChunk | None, AsyncIterator[StreamChunk]]:
            chunks = entry.backend.stream(request, pick)
            try:
                with self.waiting.hold(entry.name, num_tokens):
                    chunk = await first_chunk(chunks, first_token_s, entry.name)
            except BaseException:
                await chunks.aclose()  # type: ignore[attr-defined]
                raise
            if chunk is not None:
                ctx.meter.first_token()
            return chunk, chunks

        called = await ChainRun(self, first, request, ctx, needed, call, is_stream=True).run()
        chunk, rest = called.result
        if chunk is None:
            called.tickets.settle(None)  # an empty stream, complete
        deadline = ctx.deadline
        attempt_s = self.policy.attempt_timeout_s
        if attempt_s is not None:
            attempt_ends = asyncio.get_running_loop().time() + attempt_s
            if deadline is None or attempt_ends < deadline.ends_at:
                reason = f"{called.entry.name}: the answer took longer than {attempt_s:g} s"
                deadline = Deadline(attempt_ends, reason)
        settling: AsyncIterator[StreamChunk] = (
            DeadlineStream(rest, deadline, called.entry.name, called.tickets)
            if deadline is not None
            else SettlingStream(rest, called.tickets)
        )
        return Answered(called.entry, called.deployment, first=chunk, rest=settling, failures=called.failures)

    # -- state, for /metrics and readiness -----------------------------------------------------

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


class _Progress:
    """A whole answer's progress, as its backend reads it (`StreamProgress`): the first event lifts
    the first-token timer and is the meter's first token; the events are counted in the attempt."""

    __slots__ = ("timeout", "meter", "attempt", "held")

    def __init__(self, timeout: asyncio.Timeout, meter: AttemptMeter, attempt: InFlight, held: Held) -> None:
        self.timeout, self.meter, self.attempt, self.held = timeout, meter, attempt, held

    def first_event(self) -> None:
        self.timeout.reschedule(None)
        self.held.release()
        self.meter.first_token()

    def num_events(self, num_events: int) -> None:
        self.attempt.num_chunks = num_events


def _can_stream(request: AnyRequest) -> bool:
    """OpenAI's API refuses to stream a legacy completion with `best_of` (vLLM: beam search too)."""
    if isinstance(request, EmbeddingRequest):
        return False
    payload = request.wire_payload()
    return payload.get("best_of") in (None, 1) and not payload.get("use_beam_search")
