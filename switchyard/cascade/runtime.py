"""The cascade at request time: answer with the cheap rung, climb when its confidence is low.

A ladder lists models cheapest first. A request starts at a rung (the first for
`model="cascade"`, the classifier's pick for `model="auto"`), and climbs at most `max_depth`
rungs; the last rung it may reach is never judged.

- Non-stream: the judged rung is asked for logprobs (top `top_logprobs`); its whole answer is
  scored; confident → it is the answer, else the next rung is called.
- Stream: decided before the first byte. The judged rung's stream fills a buffer until
  `stream_tokens` tokens, the end of the answer, or `stream_budget_s` after its first chunk
  (whichever first; at least one token is waited for). Confident → the buffer is flushed and the
  rest streams on; else the stream is cancelled and the next rung streams from the start. The
  client sees one rung's stream, nothing else.
- Hedging (`x-switchyard-cascade: hedge`, or a classifier score within `hedge_margin` of its
  threshold): the next rung starts in parallel with the judged one; the loser is cancelled.
- A rung that fails (after the resilience layer's retries and fallbacks) counts as not confident,
  unless the client's request itself was refused; the last rung's failure is the answer.
- Capabilities: a rung that lacks one the client's request needs (tools, images, a JSON schema…;
  `core.capabilities.needs`) is passed over, neither called nor judged, and the header says so,
  e.g. `small(0.42<0.60)->top(large lacks json_schema)`. The logprobs the cascade asks a judged
  rung for are its own need, not the client's: they never pass a rung over.

Metering: every attempt is one ledger record (`RequestMeter.fork()` per rung, shared numbering):
the judged-and-dropped answer as `escalated` (its tokens counted), a hedge's loser as `cancelled`.
`x-switchyard-cascade` says what happened, e.g. `local-small(0.42<0.60)->local-large`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

from switchyard.backends.base import AnyRequest, answered_by
from switchyard.backends.registry import ModelEntry
from switchyard.backends.resilience import AllAttemptsFailed, ResilientExecutor
from switchyard.billing.context import RequestContext
from switchyard.billing.metering import RequestMeter
from switchyard.cascade import wire
from switchyard.cascade.confidence import Scorer, score
from switchyard.cascade.thrash import ThrashGuard
from switchyard.core.capabilities import explain, needs, unsupported_by_any
from switchyard.core.errors import BackendError, BackendRejected, BudgetExceeded, InvalidRequest
from switchyard.core.metrics import Metrics
from switchyard.core.protocol import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.tracing import child_span

logger = logging.getLogger("switchyard.cascade")

MODES = ("on", "off", "hedge")


@dataclass(frozen=True, slots=True)
class Rung:
    entry: ModelEntry
    scorer: Scorer
    threshold: float


@dataclass(frozen=True, slots=True)
class CascadePolicy:
    top_logprobs: int = 5
    stream_tokens: int = 16
    stream_budget_s: float = 0.3
    max_depth: int | None = None
    hedge_margin: float | None = None


@dataclass(slots=True)
class Plan:
    rungs: list[Rung]
    route: str  # the rung the request would start at: the thrash guard's key
    hedge: bool
    steps: list[str] = field(default_factory=list)  # what happened, for the header
    is_moved_up: bool = False
    needed: dict[str, str] = field(default_factory=dict)  # what the client's request needs of a model
    passed_over: list[str] = field(default_factory=list)  # rungs that lack a capability, for the header


@dataclass(slots=True)
class Outcome:
    entry: ModelEntry
    meter: RequestMeter  # the attempt that answered: the relay finishes it
    header: str
    result: CompletionResult | None = None
    first: StreamChunk | None = None
    rest: AsyncIterator[StreamChunk] | None = None


def _is_client_error(exc: BaseException) -> bool:
    if isinstance(exc, AllAttemptsFailed):
        return False
    return isinstance(exc, BackendRejected)


class Cascade:
    def __init__(self, rungs: list[Rung], policy: CascadePolicy, executor: ResilientExecutor, guard: ThrashGuard):
        self.rungs = rungs
        self.names = [r.entry.name for r in rungs]
        self.policy = policy
        self.executor = executor
        self.guard = guard
        self.judged: Counter[tuple[str, str]] = Counter()  # (model, accepted|escalated|no-logprobs|error)
        self.moved_up: Counter[str] = Counter()
        self.hedges: Counter[str] = Counter()  # winner rung
        self.hedge_losses: Counter[str] = Counter()  # the rung whose answer was dropped for the winner's
        self.metrics: Metrics | None = None  # the app's, set when the services are built

    # -- deciding what to do ---------------------------------------------------------------------

    def plan(
        self,
        start: ModelEntry,
        request: AnyRequest,
        mode: str | None,
        near_threshold: bool = False,
        ctx: RequestContext | None = None,
        needed: dict[str, str] | None = None,
    ) -> Plan | str | None:
        """The rungs to climb; a string says why the cascade is off; None: `start` is not a rung.
        `needed`: what the request needs of a model (`needs(request)` unless the caller has it)."""
        mode = (mode or "on").strip().lower()
        if mode not in MODES:
            raise InvalidRequest(
                f"x-switchyard-cascade must be one of {', '.join(MODES)}, not {mode!r}.", param="x-switchyard-cascade"
            )
        if start.name not in self.names:
            return None
        if mode == "off":
            return "off"
        if (request.n or 1) > 1:
            return "off(n>1)"
        if isinstance(request, ChatCompletionRequest) and request.tools:
            return "off(tools)"
        index = self.names.index(start.name)
        # The calling team's models end the ladder: a rung it may not use, and all above it.
        reachable = next(
            (i for i in range(index + 1, len(self.rungs)) if ctx is not None and not ctx.may_use(self.names[i])),
            len(self.rungs),
        )
        if needed is None:
            needed = needs(request)
        lacking = {rung.entry.name: rung.entry.capabilities.lacks(needed) for rung in self.rungs[index:reachable]}
        capable = [i for i in range(index, reachable) if not lacking[self.names[i]]]
        if not capable:
            raise unsupported_by_any("the cascade", lacking)
        steps: list[str] = []
        is_moved_up = capable[0] != index  # the relay starts the cascade at a rung that can; this is a guard
        if len(capable) > 1 and self.guard.is_cooling(start.name):
            steps.append(f"{start.name}(skipped:thrash-guard)")
            self.moved_up[start.name] += 1
            capable, is_moved_up = capable[1:], True
        depth = self.policy.max_depth or len(self.rungs)
        chosen = capable[:depth]
        rungs = [self.rungs[i] for i in chosen]
        passed_over = [
            f"({self.names[i]} lacks {explain(lacking[self.names[i]])})"
            for i in range(index, chosen[-1])
            if lacking[self.names[i]]
        ]
        hedge = mode == "hedge" or (near_threshold and self.policy.hedge_margin is not None)
        return Plan(rungs, start.name, hedge and len(rungs) > 1, steps, is_moved_up, needed, passed_over)

    def first_capable(self, needed: dict[str, str]) -> tuple[ModelEntry, list[str]]:
        """Where `model="cascade"` starts: the first rung that can serve a request needing `needed`,
        with a note for each rung below it that cannot (UnsupportedParameter if none can)."""
        notes: list[str] = []
        lacking: dict[str, list[tuple[str, str]]] = {}
        for rung in self.rungs:
            lacks = lacking[rung.entry.name] = rung.entry.capabilities.lacks(needed)
            if not lacks:
                return rung.entry, notes
            notes.append(f"({rung.entry.name} lacks {explain(lacks)})")
        raise unsupported_by_any("the cascade", lacking)

    def _judge(self, plan: Plan, rung: Rung, answered: ModelEntry, evidence, is_first: bool) -> bool:
        confidence = score(rung.scorer, evidence)
        if confidence is None:
            verdict, step = "no-logprobs", f"{answered.name}(no-logprobs)"
            accepted = False
        else:
            accepted = confidence >= rung.threshold
            verdict = "accepted" if accepted else "escalated"
            sign = ">=" if accepted else "<"
            step = f"{answered.name}({confidence:.2f}{sign}{rung.threshold:.2f})"
        self.judged[(answered.name, verdict)] += 1
        if not accepted:
            self._count_escalation(plan, rung, "low-confidence" if verdict == "escalated" else verdict)
        plan.steps.append(step)
        if is_first and not plan.is_moved_up:
            self.guard.record(plan.route, escalated=not accepted)
        return accepted

    def _count_escalation(self, plan: Plan, rung: Rung, reason: str) -> None:
        index = plan.rungs.index(rung)
        if self.metrics is not None and index + 1 < len(plan.rungs):
            self.metrics.escalated(rung.entry.name, plan.rungs[index + 1].entry.name, reason)

    def _climb_past(self, plan: Plan, rung: Rung, exc: BackendError, index: int, is_last: bool) -> None:
        """A failed rung: the last rung's failure, or the client's own mistake, is the answer."""
        if is_last or _is_client_error(exc):
            raise exc
        self._failed(plan, rung, exc, index == 0)

    def _failed(self, plan: Plan, rung: Rung, exc: BaseException, is_first: bool) -> None:
        logger.info("cascade: %s failed, climbing: %s", rung.entry.name, getattr(exc, "message", exc))
        self.judged[(rung.entry.name, "error")] += 1
        self._count_escalation(plan, rung, "error")
        plan.steps.append(f"{rung.entry.name}(error)")
        if is_first and not plan.is_moved_up:
            self.guard.record(plan.route, escalated=True)

    # -- the entry point ---------------------------------------------------------------------------

    async def run(self, plan: Plan, request: AnyRequest, ctx: RequestContext) -> Outcome:
        """Answer `request` along `plan`: a whole answer, or a stream decided before its first byte."""
        return await (self.stream if request.stream else self.complete)(plan, request, ctx)

    # -- non-stream ------------------------------------------------------------------------------

    async def complete(self, plan: Plan, request: AnyRequest, ctx: RequestContext) -> Outcome:
        wanted = wire.client_top_logprobs(request)
        attempts = _Attempts(
            plan,
            request,
            wire.with_logprobs(request, self.policy.top_logprobs),
            ctx,
            partial(_attempt, self.executor.complete),
        )
        tasks, meters, start = attempts.tasks, attempts.meters, attempts.start
        try:
            for i, rung in enumerate(plan.rungs):
                is_last = i == len(plan.rungs) - 1
                if i == 0:
                    await attempts.reserve_or_refuse(0)
                task = start(i)
                hedge = None
                if plan.hedge and i == 0 and not is_last and await attempts.reserve(i + 1):
                    hedge = start(i + 1)
                if hedge is not None:
                    await asyncio.wait({task, hedge}, return_when=asyncio.FIRST_COMPLETED)
                    if hedge.done() and not hedge.exception() and not task.done():
                        await _cancel_and_wait(task)
                        plan.steps.append(f"{rung.entry.name}(hedge-lost)")
                        self._hedge_won(plan.rungs[i + 1].entry.name, rung.entry.name)
                        continue
                try:
                    entry, result = await task
                except BackendError as exc:
                    self._climb_past(plan, rung, exc, i, is_last)
                    await attempts.reserve_or_refuse(i + 1)
                    continue
                if is_last:
                    plan.steps.append(entry.name)
                    return Outcome(entry, meters[i], self._header(plan), result=result)
                if self._judge(plan, rung, entry, wire.evidence_of(result).evidence(), i == 0):
                    if hedge is not None:
                        self._hedge_won(entry.name, plan.rungs[i + 1].entry.name)
                    return Outcome(entry, meters[i], self._header(plan), result=self._for_client(result, wanted))
                if not await attempts.reserve(i + 1):  # no budget to climb: this answer is the best there is
                    plan.steps.append("over-budget")
                    return Outcome(entry, meters[i], self._header(plan), result=self._for_client(result, wanted))
                usage = result.parsed.get("usage")
                meters[i].escalated(entry, usage, meters[i].num_chunks, "low confidence")
            raise AssertionError("the last rung always answers or raises")
        finally:
            await _cancel_and_wait(*tasks.values())

    def _hedge_won(self, winner: str, loser: str) -> None:
        self.hedges[winner] += 1
        self.hedge_losses[loser] += 1

    # -- stream ----------------------------------------------------------------------------------

    async def stream(self, plan: Plan, request: AnyRequest, ctx: RequestContext) -> Outcome:
        wanted = wire.client_top_logprobs(request)
        attempts = _Attempts(
            plan,
            request,
            wire.with_logprobs(request, self.policy.top_logprobs),
            ctx,
            partial(_attempt, self.executor.stream),
        )
        opening, meters, open_ = attempts.tasks, attempts.meters, attempts.start
        handed_over: set[int] = set()
        try:
            for i, rung in enumerate(plan.rungs):
                is_last = i == len(plan.rungs) - 1
                if i == 0:
                    await attempts.reserve_or_refuse(0)
                task = open_(i)
                if plan.hedge and i == 0 and not is_last and await attempts.reserve(i + 1):
                    open_(i + 1)
                try:
                    entry, first, rest = await task
                except BackendError as exc:
                    self._climb_past(plan, rung, exc, i, is_last)
                    await attempts.reserve_or_refuse(i + 1)
                    continue
                if is_last:
                    plan.steps.append(entry.name)
                    handed_over.add(i)
                    return Outcome(entry, meters[i], self._header(plan), first=first, rest=rest)
                buffered = _Buffered(first, rest)
                try:
                    await buffered.fill(self.policy.stream_tokens, self.policy.stream_budget_s)
                except BackendError as exc:
                    meters[i].finished(entry, "failed", None, buffered.num_chunks, exc.message)
                    await buffered.aclose()
                    self._failed(plan, rung, exc, i == 0)
                    await attempts.reserve_or_refuse(i + 1)
                    continue
                except BaseException:
                    meters[i].finished(entry, "cancelled", buffered.usage, buffered.num_tokens)
                    await buffered.aclose()
                    raise
                if self._judge(plan, rung, entry, buffered.evidence.evidence(), i == 0):
                    if i + 1 in opening:
                        self._hedge_won(entry.name, plan.rungs[i + 1].entry.name)
                    handed_over.add(i)
                    first, rest = buffered.replay(lambda chunk: self._for_client(chunk, wanted))
                    return Outcome(entry, meters[i], self._header(plan), first=first, rest=rest)
                if not await attempts.reserve(i + 1):  # no budget to climb: this answer is the best there is
                    plan.steps.append("over-budget")
                    handed_over.add(i)
                    first, rest = buffered.replay(lambda chunk: self._for_client(chunk, wanted))
                    return Outcome(entry, meters[i], self._header(plan), first=first, rest=rest)
                await buffered.aclose()
                meters[i].escalated(entry, buffered.usage, buffered.num_tokens, "low confidence")
            raise AssertionError("the last rung always answers or raises")
        finally:
            for i, task in opening.items():
                if i in handed_over:
                    continue
                await _abandon(task, meters[i], plan.rungs[i].entry)

    def _for_client(self, obj, wanted: int | None):
        """Logprobs the cascade asked for, cut back to what the client asked for."""
        if wanted is not None and wanted >= self.policy.top_logprobs:
            return obj
        return wire.for_client(obj, wanted)

    def _header(self, plan: Plan) -> str:
        return "->".join(plan.steps) + "".join(plan.passed_over) + (";hedged" if plan.hedge else "")


async def _attempt(method, entry: ModelEntry, request: AnyRequest, ctx: RequestContext, needed: dict[str, str]):
    """One rung through the resilience layer, in its own task: a cancellation is metered here.
    Its fallbacks must serve what the client's request needs (`needed`), whatever the rung is asked."""
    meter = ctx.meter
    with child_span("cascade rung", rung=entry.name):
        try:
            result = await method(entry, request, ctx, needed)
            meter.backend_label = answered_by.get()  # set in this task; the relay reads it from the meter
            return result
        except asyncio.CancelledError:
            meter.finished(meter.current_entry or entry, "cancelled", None)
            raise


class _Attempts:
    """One task per rung, each metered by its own fork of the request's meter. Judged rungs get the
    request with logprobs; the last rung gets the client's request as it came."""

    def __init__(self, plan: Plan, request: AnyRequest, judged_request: AnyRequest, ctx: RequestContext, call):
        self.plan, self.request, self.judged_request, self.ctx, self.call = plan, request, judged_request, ctx, call
        self.tasks: dict[int, asyncio.Task] = {}
        self.meters: dict[int, RequestMeter] = {}
        # Rungs whose worst-case cost the budgets hold: the relay reserved the admitted model, which
        # is the first rung unless the thrash guard moved the plan up a rung.
        self.reserved = set() if plan.is_moved_up else {0}

    async def reserve(self, i: int) -> bool:
        """Hold rung i's worst-case cost in the caller's budgets before starting it (True: it fits)."""
        if i in self.reserved:
            return True
        rung = self.plan.rungs[i].entry
        request = self.request if i == len(self.plan.rungs) - 1 else self.judged_request
        if not await self.ctx.reserve_for(rung.name, request):
            return False
        self.reserved.add(i)
        return True

    async def reserve_or_refuse(self, i: int) -> None:
        """Rung i is the only way to an answer (the first, or the one above a failed rung), if the
        budget allows it."""
        if not await self.reserve(i):
            why = f"The cascade's {self.plan.rungs[i - 1].entry.name} failed, and w" if i > 0 else "W"
            raise BudgetExceeded(
                f"{why}hat is left of the budget does not cover {self.plan.rungs[i].entry.name}.", retry_after_s=1
            )

    def start(self, i: int) -> asyncio.Task:
        if i not in self.tasks:
            climbed_from = self.plan.rungs[i - 1].entry.name if i > 0 else None
            is_hedge = self.plan.hedge and i == 1 and 0 in self.tasks and not self.tasks[0].done()
            self.meters[i] = self.ctx.meter.fork(escalated_from=climbed_from, is_hedge=is_hedge)
            is_last = i == len(self.plan.rungs) - 1
            request = self.request if is_last else self.judged_request
            rung_ctx = self.ctx.with_meter(self.meters[i])
            self.tasks[i] = asyncio.ensure_future(
                self.call(self.plan.rungs[i].entry, request, rung_ctx, self.plan.needed)
            )
        return self.tasks[i]


async def _cancel_and_wait(*futures: asyncio.Future) -> None:
    """Cancel child work and wait for it to finish; their outcomes are dropped, but a cancellation
    of the task that waits still propagates (gather is cancelled with it)."""
    for future in futures:
        future.cancel()
    if futures:
        await asyncio.gather(*futures, return_exceptions=True)


async def _abandon(task: asyncio.Task, meter: RequestMeter, entry: ModelEntry) -> None:
    """An opened (or opening) stream nobody will read: cancel it, meter it once."""
    if not task.done():
        await _cancel_and_wait(task)
        return  # `_attempt` metered the cancellation
    if task.cancelled() or task.exception() is not None:
        return
    answered, first, rest = task.result()
    await rest.aclose()
    if not meter.is_closed:
        meter.finished(answered, "cancelled", None, 1 if first is not None else 0)


class _Buffered:
    """A judged stream: chunks held back until the verdict, then replayed or dropped."""

    def __init__(self, first: StreamChunk | None, rest: AsyncIterator[StreamChunk]) -> None:
        self.chunks: list[StreamChunk] = []
        self.evidence = wire.EvidenceBuffer()
        self.rest = rest
        self.pending: asyncio.Future | None = None
        self.is_ended = False
        self.usage: dict | None = None
        if first is None:
            self.is_ended = True
        else:
            self._add(first)

    def _add(self, chunk: StreamChunk) -> None:
        self.chunks.append(chunk)
        self.evidence.add(chunk)
        if chunk.has_usage:
            self.usage = chunk.parsed["usage"]

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return self.evidence.num_tokens or len(self.chunks)

    async def fill(self, max_tokens: int, budget_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        while not self.is_ended and not self.evidence.is_finished and self.evidence.num_tokens < max_tokens:
            if self.pending is None:
                self.pending = asyncio.ensure_future(anext(self.rest, None))
            timeout = max(0.0, deadline - loop.time()) if self.evidence.num_tokens else None
            done, _ = await asyncio.wait({self.pending}, timeout=timeout)
            if not done:
                return  # over budget: judge what is here; the pending read carries on
            chunk, self.pending = self.pending.result(), None
            if chunk is None:
                self.is_ended = True
            else:
                self._add(chunk)

    def replay(self, for_client) -> tuple[StreamChunk | None, AsyncIterator[StreamChunk]]:
        chunks = [for_client(c) for c in self.chunks]
        return (chunks[0] if chunks else None), _Replay(self, chunks[1:], for_client)

    async def aclose(self) -> None:
        if self.pending is not None:
            await _cancel_and_wait(self.pending)
            self.pending = None
        await self.rest.aclose()


class _Replay:
    """The held-back chunks, then the read that was pending at the verdict, then the rest.

    A class, not an async generator, so that `aclose()` closes the upstream even if the client
    never read a byte (an unstarted generator's `finally` never runs).
    """

    def __init__(self, buffered: _Buffered, held: list[StreamChunk], for_client) -> None:
        self.buffered, self.held, self.for_client = buffered, list(held), for_client

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamChunk:
        if self.held:
            return self.held.pop(0)
        buffered = self.buffered
        if buffered.pending is not None:
            chunk, buffered.pending = await buffered.pending, None
            if chunk is None:
                buffered.is_ended = True
            else:
                return self.for_client(chunk)
        if buffered.is_ended:
            raise StopAsyncIteration
        return self.for_client(await anext(buffered.rest))

    async def aclose(self) -> None:
        await self.buffered.aclose()
