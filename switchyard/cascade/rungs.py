"""The rungs of one cascade request: a task per rung started, each metered by its own fork of the
request's meter, and a rung's answer while it is judged (a whole answer, or a stream held back),
for non-stream and stream requests alike (`WHOLE`, `STREAMS`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from switchyard.backends.answered import Answered
from switchyard.backends.base import AnyRequest
from switchyard.backends.registry import ModelEntry
from switchyard.backends.resilience import ResilientExecutor
from switchyard.cascade import logprobs
from switchyard.cascade.buffer import Buffered, cancel_and_wait
from switchyard.cascade.confidence import TokenEvidence
from switchyard.core.errors import BackendError, BudgetExceeded
from switchyard.core.metering import AttemptMeter
from switchyard.core.request_context import Caller, RequestContext, Team
from switchyard.core.tracing import child_span

ForClient = Callable[[Any], Any]  # logprobs cut back to what the client asked for
M = TypeVar("M", bound=AttemptMeter)  # the request's meter, whatever its kind: forks are of the same


# What the cascade answered: the rung's answer (saying what the cascade did, `Answered.cascade`), and
# the fork of the request's meter that metered it (the relay finishes it).
Outcome = tuple[Answered, M]


class Candidate(Protocol):
    """A judged rung's answer, held until the verdict."""

    @property
    def entry(self) -> ModelEntry: ...

    def evidence(self) -> TokenEvidence | None:
        """None: the answer carried no logprobs."""

    def outcome(self, meter: M, header: str, for_client: ForClient) -> Outcome[M]: ...

    async def drop(self, meter: AttemptMeter, reason: str) -> None:
        """Not sent: metered as escalated (its tokens counted), for `reason` (the verdict)."""


@dataclass(slots=True)
class WholeCandidate:
    answer: Answered

    @property
    def entry(self) -> ModelEntry:
        return self.answer.entry

    def evidence(self) -> TokenEvidence | None:
        return logprobs.evidence_of(self.answer.whole).evidence()

    def outcome(self, meter: M, header: str, for_client: ForClient) -> Outcome[M]:
        return replace(self.answer, result=for_client(self.answer.whole), cascade=header), meter

    async def drop(self, meter: AttemptMeter, reason: str) -> None:
        answer = self.answer
        usage = answer.whole.parsed.get("usage")
        meter.escalated(answer.entry, usage, answer.num_chunks, reason, deployment=answer.deployment)


@dataclass(slots=True)
class StreamCandidate:
    opened: Answered
    buffered: Buffered

    @property
    def entry(self) -> ModelEntry:
        return self.opened.entry

    def evidence(self) -> TokenEvidence | None:
        return self.buffered.evidence.evidence()

    def outcome(self, meter: M, header: str, for_client: ForClient) -> Outcome[M]:
        first, rest = self.buffered.replay(for_client)
        return replace(self.opened, first=first, rest=rest, cascade=header), meter

    async def drop(self, meter: AttemptMeter, reason: str) -> None:
        await self.buffered.aclose()
        opened, buffered = self.opened, self.buffered
        meter.escalated(opened.entry, buffered.usage, buffered.num_tokens, reason, deployment=opened.deployment)


class WholeAnswers:
    """Non-stream: a rung's whole answer is judged; a hedge that answers first wins outright."""

    races_hedge = True

    @staticmethod
    def call(executor: ResilientExecutor) -> Callable[..., Awaitable[Answered]]:
        return executor.complete

    @staticmethod
    async def judged(answer: Answered, meter: AttemptMeter, tokens: int, budget_s: float) -> Candidate:
        return WholeCandidate(answer)

    @staticmethod
    def last(answer: Answered, meter: M, header: str) -> Outcome[M]:
        return replace(answer, cascade=header), meter

    @staticmethod
    async def abandon(answer: Answered, meter: AttemptMeter) -> None:
        """An answer that came and was not used (a hedge that lost the verdict's race)."""
        usage = answer.whole.parsed.get("usage")
        meter.finished(answer.entry, "cancelled", usage, answer.num_chunks, deployment=answer.deployment)


class Streams:
    """Stream: decided before the first byte. A judged rung's stream is held back until
    `stream_tokens` tokens, its end, or `stream_budget_s` after its first chunk."""

    races_hedge = False

    @staticmethod
    def call(executor: ResilientExecutor) -> Callable[..., Awaitable[Answered]]:
        return executor.stream

    @staticmethod
    async def judged(opened: Answered, meter: AttemptMeter, tokens: int, budget_s: float) -> Candidate:
        buffered = Buffered(opened.first, opened.chunks)
        try:
            await buffered.fill(tokens, budget_s)
        except BackendError as exc:  # broke after its first byte: a failed attempt
            meter.finished(opened.entry, "failed", None, buffered.num_chunks, exc.message, deployment=opened.deployment)
            await buffered.aclose()
            raise
        except BaseException:
            meter.finished(opened.entry, "cancelled", buffered.usage, buffered.num_tokens, deployment=opened.deployment)
            await buffered.aclose()
            raise
        return StreamCandidate(opened, buffered)

    @staticmethod
    def last(opened: Answered, meter: M, header: str) -> Outcome[M]:
        return replace(opened, cascade=header), meter

    @staticmethod
    async def abandon(opened: Answered, meter: AttemptMeter) -> None:
        """An opened stream nobody will read (metered once: unless its attempt was metered already)."""
        await opened.chunks.aclose()  # type: ignore[attr-defined]
        num_chunks = 1 if opened.first is not None else 0
        meter.finished(opened.entry, "cancelled", None, num_chunks, deployment=opened.deployment)


Kind = type[WholeAnswers] | type[Streams]


class RungTasks(Generic[M]):
    """One task per rung, each metered by its own fork of the request's meter. Judged rungs get the
    request with logprobs; the last rung gets the client's request as it came."""

    def __init__(
        self,
        rungs: list[ModelEntry],
        request: AnyRequest,
        judged_request: AnyRequest,
        ctx: RequestContext[Caller[Team], M],
        needed: dict[str, str],
        call: Callable[..., Awaitable[Any]],
        *,
        hedge: bool,
    ) -> None:
        self.rungs, self.request, self.judged_request, self.ctx = rungs, request, judged_request, ctx
        self.needed, self.call, self.hedge = needed, call, hedge
        self.tasks: dict[int, asyncio.Task] = {}
        self.meters: dict[int, M] = {}
        self.handed_over: set[int] = set()

    def request_of(self, i: int) -> AnyRequest:
        return self.request if i == len(self.rungs) - 1 else self.judged_request

    async def reserve(self, i: int) -> bool:
        """Hold rung i's worst-case cost in the caller's budgets before starting it (True: it fits)."""
        return await self.ctx.meter.reserve_for(self.rungs[i].name, self.request_of(i))

    async def reserve_or_refuse(self, i: int) -> None:
        """Rung i is the only way to an answer (the first, or the one above a failed rung), if the
        budget allows it."""
        if not await self.reserve(i):
            why = f"The cascade's {self.rungs[i - 1].name} failed, and w" if i > 0 else "W"
            refusal = await self.ctx.meter.refusal_for(self.rungs[i].name, self.request_of(i))
            raise BudgetExceeded(
                f"{why}hat is left of the budget does not cover {self.rungs[i].name}"
                + (f": {refusal.message}" if refusal is not None else "."),
                retry_after_s=refusal.retry_after_s if refusal is not None else 1,
            )

    def start(self, i: int) -> asyncio.Task:
        if i not in self.tasks:
            climbed_from = self.rungs[i - 1].name if i > 0 else None
            is_hedge = self.hedge and i == 1 and 0 in self.tasks and not self.tasks[0].done()
            self.meters[i] = self.ctx.meter.fork(escalated_from=climbed_from, is_hedge=is_hedge)
            rung_ctx = self.ctx.with_meter(self.meters[i])
            self.tasks[i] = asyncio.ensure_future(self._rung(self.rungs[i], self.request_of(i), rung_ctx))
        return self.tasks[i]

    async def _rung(self, entry: ModelEntry, request: AnyRequest, ctx: RequestContext[Caller[Team], M]) -> Any:
        """One rung through the resilience layer (which meters a cancellation), in its own task.
        Its fallbacks must serve what the client's request needs, whatever the rung is asked."""
        with child_span("cascade rung", rung=entry.name):
            return await self.call(entry, request, ctx, self.needed)

    def hand_over(self, i: int, outcome: Outcome[M]) -> Outcome[M]:
        self.handed_over.add(i)
        return outcome

    async def close(self, kind: Kind) -> None:
        """Every rung's task not handed over to the relay: cancelled, or its answer dropped, metered once."""
        for i, task in self.tasks.items():
            if i in self.handed_over:
                continue
            if not task.done():
                await cancel_and_wait(task)  # the resilience layer metered the cancellation
            elif not task.cancelled() and task.exception() is None:
                await kind.abandon(task.result(), self.meters[i])
