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

Metering: every attempt is one ledger record (a `fork()` of the request's meter per rung, shared
numbering; `core.metering.AttemptMeter`): the judged-and-dropped answer as `escalated` (its tokens
counted), a hedge's loser as `cancelled`.
`x-switchyard-cascade` says what happened, e.g. `local-small(0.42<0.60)->local-large`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from switchyard.backends.registry import ModelEntry
from switchyard.backends.resilience import ResilientExecutor
from switchyard.cascade import logprobs
from switchyard.cascade.buffer import cancel_and_wait
from switchyard.cascade.confidence import Scorer, score
from switchyard.cascade.rungs import M, Outcome, RungTasks, Streams, WholeAnswers
from switchyard.cascade.thrash import ThrashGuard
from switchyard.core.capabilities import explain, unsupported_by_any
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.drift import DriftMonitor
from switchyard.core.errors import AllAttemptsFailed, BackendError, BackendRejected, InvalidRequest
from switchyard.core.metering import AttemptMeter
from switchyard.core.metrics import Metrics
from switchyard.core.request_context import AnyContext, Caller, RequestContext, Team
from switchyard.core.requests import GenerationRequest

__all__ = ["Cascade", "CascadePolicy", "Outcome", "Plan", "Rung"]

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


def _is_client_error(exc: BaseException) -> bool:
    if isinstance(exc, AllAttemptsFailed):
        return False
    return isinstance(exc, BackendRejected)


class Cascade:
    def __init__(
        self,
        rungs: list[Rung],
        policy: CascadePolicy,
        executor: ResilientExecutor,
        guard: ThrashGuard,
        metrics: Metrics | None = None,
        drift: DriftMonitor | None = None,
    ) -> None:
        self.rungs = rungs
        self.drift = drift  # each judged answer's confidence goes to its window
        self.names = [r.entry.name for r in rungs]
        self.policy = policy
        self.executor = executor
        self.guard = guard
        self.judged: Counter[tuple[str, str]] = Counter()  # (model, accepted|escalated|no-logprobs|error)
        self.moved_up: Counter[str] = Counter()
        self.hedges: Counter[str] = Counter()  # winner rung
        self.hedge_losses: Counter[str] = Counter()  # the rung whose answer was dropped for the winner's
        self.metrics = metrics  # the app's

    def with_rungs(self, rungs: list[Rung], drift: DriftMonitor | None) -> Cascade:
        """The same ladder judged by other scorers and thresholds (another routing version, with the
        drift windows of its own reference): its counters and thrash guard are this one's, so the
        metrics count every version's requests."""
        other = Cascade(rungs, self.policy, self.executor, self.guard, self.metrics, drift)
        other.judged, other.moved_up, other.hedges, other.hedge_losses = (
            self.judged,
            self.moved_up,
            self.hedges,
            self.hedge_losses,
        )
        return other

    # -- deciding what to do ---------------------------------------------------------------------

    def plan(
        self,
        start: ModelEntry,
        request: GenerationRequest,
        mode: str | None,
        near_threshold: bool = False,
        ctx: AnyContext | None = None,
        *,
        needed: dict[str, str],
    ) -> Plan | str | None:
        """The rungs to climb; a string says why the cascade is off; None: `start` is not a rung.
        `needed`: what the client's request needs of a model (`core.capabilities.needs`)."""
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

    def _judge(
        self, plan: Plan, rung: Rung, answered: ModelEntry, evidence, is_first: bool, meter: AttemptMeter
    ) -> str | None:
        """Why `answered` is not the answer (low-confidence, no-logprobs); None: it is."""
        confidence = score(rung.scorer, evidence)
        meter.judged(confidence, rung.threshold)  # the attempt's record keeps both
        if confidence is None:
            verdict, step = "no-logprobs", f"{answered.name}(no-logprobs)"
            accepted = False
        else:
            accepted = confidence >= rung.threshold
            verdict = "accepted" if accepted else "escalated"
            sign = ">=" if accepted else "<"
            step = f"{answered.name}({confidence:.2f}{sign}{rung.threshold:.2f})"
        self.judged[(answered.name, verdict)] += 1
        if self.drift is not None:
            self.drift.observe_confidence(rung.entry.name, confidence, not accepted)
        reason = None if accepted else "low-confidence" if verdict == "escalated" else verdict
        if reason is not None:
            self._count_escalation(plan, rung, reason)
        plan.steps.append(step)
        if is_first and not plan.is_moved_up:
            self.guard.record(plan.route, escalated=not accepted)
        return reason

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

    async def run(self, plan: Plan, request: GenerationRequest, ctx: RequestContext[Caller[Team], M]) -> Outcome[M]:
        """Answer `request` along `plan`: a whole answer, or a stream decided before its first byte.
        One loop for both: a rung is started (a hedge beside the first), its answer judged, and
        either handed to the relay or dropped for the next rung."""
        kind = Streams if request.stream else WholeAnswers
        wanted = logprobs.client_top_logprobs(request)
        rungs = RungTasks(
            [rung.entry for rung in plan.rungs],
            request,
            logprobs.with_logprobs(request, self.policy.top_logprobs),
            ctx,
            plan.needed,
            kind.call(self.executor),
            hedge=plan.hedge,
        )
        try:
            for i, rung in enumerate(plan.rungs):
                is_last = i == len(plan.rungs) - 1
                if i == 0:
                    await rungs.reserve_or_refuse(0)
                task = rungs.start(i)
                hedge = None
                if plan.hedge and i == 0 and not is_last and await rungs.reserve(i + 1):
                    hedge = rungs.start(i + 1)
                if hedge is not None and kind.races_hedge and await self._hedge_answered_first(plan, i, task, hedge):
                    continue
                meter = rungs.meters[i]
                try:
                    answered = await task
                    if is_last:
                        plan.steps.append(answered.entry.name)
                        return rungs.hand_over(i, kind.last(answered, meter, self._header(plan)))
                    candidate = await kind.judged(
                        answered, meter, self.policy.stream_tokens, self.policy.stream_budget_s
                    )
                except BackendError as exc:
                    self._climb_past(plan, rung, exc, i, is_last)
                    await rungs.reserve_or_refuse(i + 1)
                    continue
                dropped_for = self._judge(plan, rung, candidate.entry, candidate.evidence(), i == 0, meter)
                if dropped_for is None and hedge is not None:
                    self._hedge_won(candidate.entry.name, plan.rungs[i + 1].entry.name)
                if dropped_for is not None and not await rungs.reserve(i + 1):
                    plan.steps.append("over-budget")  # no budget to climb: this answer is the best there is
                    dropped_for = None
                if dropped_for is None:
                    for_client = lambda obj: self._for_client(obj, wanted)  # noqa: E731
                    return rungs.hand_over(i, candidate.outcome(meter, self._header(plan), for_client))
                await candidate.drop(meter, dropped_for)
            raise AssertionError("the last rung always answers or raises")
        finally:
            await rungs.close(kind)

    async def _hedge_answered_first(self, plan: Plan, i: int, task: asyncio.Task, hedge: asyncio.Task) -> bool:
        """A whole answer from the hedge before the judged rung's: the judged rung is dropped."""
        await asyncio.wait({task, hedge}, return_when=asyncio.FIRST_COMPLETED)
        if not hedge.done() or hedge.exception() is not None or task.done():
            return False
        await cancel_and_wait(task)
        plan.steps.append(f"{plan.rungs[i].entry.name}(hedge-lost)")
        self._hedge_won(plan.rungs[i + 1].entry.name, plan.rungs[i].entry.name)
        return True

    def _hedge_won(self, winner: str, loser: str) -> None:
        self.hedges[winner] += 1
        self.hedge_losses[loser] += 1

    def _for_client(self, obj, wanted: int | None):
        """Logprobs the cascade asked for, cut back to what the client asked for."""
        if wanted is not None and wanted >= self.policy.top_logprobs:
            return obj
        return logprobs.for_client(obj, wanted)

    def _header(self, plan: Plan) -> str:
        return "->".join(plan.steps) + "".join(plan.passed_over) + (";hedged" if plan.hedge else "")
