"""Shadow sampling: a share of `auto` and `cascade` requests answered again by another model, on
spare capacity, after the client has its answer; the pair graded and kept as a learning row.

The proxy asks `wants()` for each model request (a hash of the request id against `shadow.rate`,
the teams and models filters: the same answer before its first byte as after it) and, once the
response is over, hands what the client got to `offer()`. Jobs wait in a bounded queue (full:
dropped and counted) and run one at a time (`shadow.concurrency`) when this process has spare
capacity, by the batch tier's rule (`switchyard.batch.spare_capacity`). A job:

1. picks the other side (`shadow.target`): other_tier, the stronger model for a weak answer and the
   weaker for a strong one; next_rung, the rung above (below, for the top one); strongest;
2. asks it the same messages and parameters, non-stream, through the resilient executor
   (retries, fallbacks, breakers), with logprobs when it is the weaker side;
3. grades the pair (`switchyard.learning.graders.grade`), the judge being one more chat request;
4. writes the row (`switchyard.learning.rows`), with the classifier's embedding and features of the
   text it scored.

Shadow and judge calls are ledger records of the original request (`is_shadow`, the original
team; attempts numbered from 1001), charged to `shadow.budget_usd_per_day`, never the team's budget.
Outcomes, counted in `switchyard_shadow_requests_total{outcome}`: sampled, dropped, over_budget,
skipped (a completions request, or no other model to ask), failed, completed, labelled,
unlabelled. The model that answered the client answers once more, whole, when its answer streamed
(it is not kept as it streams) or when it is the weaker side and its answer came without the
logprobs its backend can give (re-tuning the cascade needs them): one more shadow call, on the
same budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from switchyard.backends.registry import ModelEntry
from switchyard.batch.spare_capacity import SpareCapacity
from switchyard.billing.metering import RequestMeter, RequestTags, RequestTotals, usage_of
from switchyard.billing.teams import Principal
from switchyard.cascade import logprobs
from switchyard.cascade.confidence import score as confidence_score
from switchyard.core.capabilities import needs
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult
from switchyard.core.errors import SwitchyardError
from switchyard.core.estimates import estimated_prompt_tokens, routing_text
from switchyard.core.prices import Price
from switchyard.core.request_context import Deadline, RequestContext
from switchyard.core.settings import ShadowSettings
from switchyard.core.supervision import SupervisedTask
from switchyard.gateway.relay import Relayed
from switchyard.gateway.services import Services
from switchyard.learning.budget import ShadowBudget
from switchyard.learning.graders import Answer, Label, grade
from switchyard.learning.rows import LearningRow, delete_rows, features_of, hash_key, insert_row, prompt_key

logger = logging.getLogger("switchyard.shadow")

ROUTES = ("auto", "cascade")
SHADOW_ATTEMPTS_FROM = 1000  # a shadowed request's shadow and judge attempts are numbered 1001, 1002, …
JUDGE_MAX_TOKENS = 512
PRUNE_EVERY_S = 3600.0


def is_sampled(request_id: str, rate: float) -> bool:
    """Deterministic on the request id: the same answer whenever it is asked."""
    if rate <= 0:
        return False
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass(frozen=True, slots=True)
class Kept:
    """What the client of a sampled request got, kept for its shadow job."""

    request_id: str
    created_at: float  # unix s
    principal: Principal | None
    request: ChatCompletionRequest
    route: str  # auto | cascade
    model: str  # the model that answered
    result: CompletionResult | None  # its whole answer; None: it streamed (asked again, whole, by the job)
    score: float | None  # the classifier's (auto)
    routing_version: str | None = None  # the routing version that routed it (gateway/routings.py)


class _OverBudget(Exception):
    """The day's shadow budget is spent."""


def _unit_price(price: Price | None) -> float:
    return (price.input_usd_per_mtok + price.output_usd_per_mtok) if price is not None else 0.0


def _text_of(result: CompletionResult) -> str:
    choices = result.parsed.get("choices") or [{}]
    message = choices[0].get("message") or {}
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _token_logprobs(result: CompletionResult) -> dict[str, Any]:
    """`token_logprobs` and `top_logprobs` of a chat answer, when it carries them."""
    choices = result.parsed.get("choices") or [{}]
    entries = (choices[0].get("logprobs") or {}).get("content") or []
    if not entries:
        return {}
    return {
        "token_logprobs": [float(e["logprob"]) for e in entries],
        "top_logprobs": [
            [{"token": a.get("token"), "logprob": float(a["logprob"])} for a in e.get("top_logprobs") or ()]
            for e in entries
        ],
    }


class Shadow:
    def __init__(self, services: Services, spare: SpareCapacity, hash_key: bytes) -> None:
        self.services = services
        self.settings: ShadowSettings = services.settings.shadow
        self.spare = spare
        self.hash_key = hash_key
        self.budget = ShadowBudget(self.settings.budget_usd_per_day, services.database)
        self.queue: asyncio.Queue[Kept] = asyncio.Queue(maxsize=self.settings.max_pending)

    def count(self, outcome: str) -> None:
        self.services.metrics.shadow_requests.labels(outcome).inc()

    # -- sampling ----------------------------------------------------------------------------------

    def wants(self, request_id: str, requested_model: str, team: str | None) -> bool:
        """Whether this request is shadowed (decided on its id: the same before its first byte and after)."""
        settings = self.settings
        if requested_model not in ROUTES or not is_sampled(request_id, settings.rate):
            return False
        if settings.teams and team not in settings.teams:
            return False
        return True

    def offer(
        self, request_id: str, created_at: float, principal: Principal | None, parsed: Any, relayed: Relayed
    ) -> None:
        """After the client has its answer: queue the job (or count why there is none)."""
        team = principal.team.name if principal is not None else None
        if not self.wants(request_id, parsed.model, team):
            return
        answered = relayed.answered
        if relayed.status != 200 or answered is None:
            return  # no answer to compare
        if not self._matches_models(parsed.model, answered.entry.name):
            return
        self.count("sampled")
        if not isinstance(parsed, ChatCompletionRequest):
            self.count("skipped")  # a completions request: no conversation to grade
            return
        decision = relayed.decision
        score = decision.score if decision is not None else None
        version = decision.routing.version if decision is not None and decision.routing is not None else None
        kept = Kept(
            request_id,
            created_at,
            principal,
            parsed,
            parsed.model,
            answered.entry.name,
            answered.result,
            score,
            version,
        )
        try:
            self.queue.put_nowait(kept)
        except asyncio.QueueFull:
            self.count("dropped")

    def _matches_models(self, route: str, model: str) -> bool:
        models = self.settings.models
        return not models or route in models or model in models

    # -- running -----------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                kept = await self.queue.get()
                while len(running) >= self.settings.concurrency:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                await self.spare.wait()
                task = asyncio.create_task(self._run_counted(kept), name=f"shadow:{kept.request_id}")
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def prune_forever(self) -> None:
        """Rows older than `shadow.retention_days` are deleted: at start, then every hour."""
        database = self.services.database
        assert database is not None
        while True:
            cutoff = time.time() - self.settings.retention_days * 86_400
            num_deleted = await delete_rows(database, before=cutoff)
            if num_deleted:
                logger.info("deleted %d learning row(s) older than %g days", num_deleted, self.settings.retention_days)
            await asyncio.sleep(PRUNE_EVERY_S)

    async def _run_counted(self, kept: Kept) -> None:
        try:
            self.count(await self.run(kept))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the shadow job of %s failed", kept.request_id)
            self.count("failed")

    async def run(self, kept: Kept) -> str:
        """One job; returns its outcome (`labelled` and `unlabelled` follow a counted `completed`)."""
        target = self.target_of(kept)
        if target is None:
            return "skipped"
        if await self.budget.remaining_usd() <= 0:
            return "over_budget"
        totals = RequestTotals(num_attempts=SHADOW_ATTEMPTS_FROM)
        try:
            if self._asks_again(kept, target):
                answered = self.services.registry.find(kept.model)
                if answered is None:
                    return "skipped"
                again = await self._call(answered, self._shadow_request(kept, answered), kept, totals)
                kept = dataclasses.replace(kept, result=again)
            shadow_result = await self._call(target, self._shadow_request(kept, target), kept, totals)
        except SwitchyardError as exc:
            logger.info("the shadow call of %s failed: %s", kept.request_id, exc.log_message)
            return "failed"
        self.count("completed")
        sides = self._sides(kept, target, shadow_result)
        try:
            label = await grade(
                [m.model_dump(exclude_none=True) for m in kept.request.messages],
                (Answer(sides[0][0], _text_of(sides[0][1])), Answer(sides[1][0], _text_of(sides[1][1]))),
                kind=self._grader_kind(kept),
                judge=self._judge(kept, totals),
                json_schema=self._json_schema(kept.request),
            )
        except _OverBudget:
            label = None
            self.count("over_budget")
        except SwitchyardError as exc:
            logger.info("the judge of %s failed: %s", kept.request_id, exc.log_message)
            label = None
        await self._write_row(kept, sides, label)
        weak, strong = sides[0][0], sides[1][0]
        drift = self.services.drift
        if label is not None and drift is not None and weak != strong:
            drift.observe_label(label.quality[weak] >= label.quality[strong])
        return "labelled" if label is not None else "unlabelled"

    # -- the other side ----------------------------------------------------------------------------

    def ladder(self, route: str) -> list[str]:
        """The models of the route, weakest first: the cascade's rungs, or one model per auto tier."""
        services = self.services
        if route == "cascade":
            return list(services.cascade.names) if services.cascade is not None else []
        router = services.auto_router
        if router is None:
            return []
        return [router.models_by_tier[tier][0].name for tier in router.tiers if router.models_by_tier.get(tier)]

    def target_of(self, kept: Kept) -> ModelEntry | None:
        ladder = self.ladder(kept.route)
        if kept.model not in ladder or len(ladder) < 2:
            return None
        at, top = ladder.index(kept.model), len(ladder) - 1
        target = self.settings.target
        if target == "other_tier":
            index = top if at == 0 else 0
        elif target == "next_rung":
            index = at + 1 if at < top else at - 1
        else:  # strongest
            index = top if at < top else top - 1
        return self.services.registry.find(ladder[index])

    def _price(self, model: str) -> float:
        return _unit_price(self.services.prices.get(model))

    def _is_weaker(self, model: str, than: str, ladder: list[str]) -> bool:
        """Cheaper; at one price, lower on the route's ladder."""
        return (self._price(model), ladder.index(model)) < (self._price(than), ladder.index(than))

    def _asks_again(self, kept: Kept, target: ModelEntry) -> bool:
        """Whether the model that answered the client answers once more, whole: its answer streamed
        (not kept as it streamed), or it is the weaker side and its answer came without the logprobs
        its backend can give (the client did not ask for them; the cascade's judged rungs drop them
        from what they send), which re-tuning the cascade needs."""
        if kept.result is None:
            return True
        if not self._is_weaker(kept.model, target.name, self.ladder(kept.route)):
            return False
        entry = self.services.registry.find(kept.model)
        return entry is not None and entry.capabilities.logprobs and not _token_logprobs(kept.result)

    def _sides(
        self, kept: Kept, target: ModelEntry, shadow_result: CompletionResult
    ) -> tuple[tuple[str, CompletionResult, bool], tuple[str, CompletionResult, bool]]:
        """((weak model, its answer, answered the client), (strong …)): the cheaper is weak; at one
        price, the lower on the route's ladder."""
        ladder = self.ladder(kept.route)
        assert kept.result is not None  # a stream's was asked again before
        client = (kept.model, kept.result, True)
        shadow = (target.name, shadow_result, False)
        if self._is_weaker(target.name, kept.model, ladder):
            return shadow, client
        return client, shadow

    def _shadow_request(self, kept: Kept, target: ModelEntry) -> ChatCompletionRequest:
        payload = kept.request.wire_payload()
        payload.update(model=target.name, stream=False)
        payload.pop("stream_options", None)
        request = ChatCompletionRequest.from_payload(payload)
        is_weaker = self._price(target.name) <= self._price(kept.model)
        if is_weaker and target.capabilities.logprobs:
            top = self.services.settings.cascade.top_logprobs
            asked = logprobs.with_logprobs(request, top)
            assert isinstance(asked, ChatCompletionRequest)
            return asked
        return request

    async def _call(
        self, entry: ModelEntry, request: ChatCompletionRequest, kept: Kept, totals: RequestTotals
    ) -> CompletionResult:
        """One shadow or judge call: metered into the request's ledger rows as shadow, charged to the
        platform's shadow budget (no team budget is opened)."""
        await self.spare.wait()  # each call of a job waits for room, not only its start
        services = self.services
        team = kept.principal.team.name if kept.principal is not None else None
        meter = RequestMeter(
            services.ledger,
            services.prices,
            kept.request_id,
            prompt_tokens_estimate=estimated_prompt_tokens(request),
            team=team,
            totals=totals,
            tags=RequestTags(
                key_id=kept.principal.key.id if kept.principal is not None else None,
                requested_model=kept.route,
                route="shadow",
                is_shadow=True,
            ),
        )
        before_usd = totals.cost_usd
        started_at = asyncio.get_running_loop().time()
        ctx: RequestContext = RequestContext(
            kept.request_id, meter, None, Deadline.after(started_at, services.executor.request_timeout_s(entry))
        )
        try:
            answered = await services.executor.complete(entry, request, ctx, needs(request))
            result = answered.whole
            meter.finished(
                answered.entry, "completed", usage_of(result), answered.num_chunks, deployment=answered.deployment
            )
            return result
        finally:
            self.budget.charge(totals.cost_usd - before_usd)

    # -- grading -----------------------------------------------------------------------------------

    def _grader_kind(self, kept: Kept) -> str:
        graders = self.settings.graders
        team = kept.principal.team.name if kept.principal is not None else None
        if team is not None and team in graders:
            return graders[team]
        return graders.get(kept.route, "auto")

    @staticmethod
    def _json_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
        response_format = request.wire_payload().get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
            return schema if isinstance(schema, dict) else None
        return None

    def judge_model(self) -> ModelEntry | None:
        """`shadow.judge.model`, else the configured chat model with the highest price."""
        registry = self.services.registry
        if self.settings.judge.model is not None:
            return registry.find(self.settings.judge.model)
        chat = [entry for entry in registry if entry.kind == "chat" and entry.parent is None]
        return max(chat, key=lambda entry: self._price(entry.name), default=None)

    def _judge(self, kept: Kept, totals: RequestTotals) -> Any:
        entry = self.judge_model()
        if entry is None:
            return None

        async def judge(messages: list[dict[str, Any]]) -> str:
            if await self.budget.remaining_usd() <= 0:
                raise _OverBudget
            request = ChatCompletionRequest.from_payload(
                {"model": entry.name, "messages": messages, "temperature": 0, "max_tokens": JUDGE_MAX_TOKENS}
            )
            return _text_of(await self._call(entry, request, kept, totals))

        return judge

    # -- the row -----------------------------------------------------------------------------------

    async def _write_row(
        self,
        kept: Kept,
        sides: tuple[tuple[str, CompletionResult, bool], tuple[str, CompletionResult, bool]],
        label: Label | None,
    ) -> None:
        database = self.services.database
        assert database is not None
        read_system = self.services.settings.routing.auto.read_system_prompt
        scored_text = routing_text(kept.request, read_system)
        embedding = None
        if self.services.embed_texts is not None:
            await self.spare.wait()
            embedded = await asyncio.to_thread(self.services.embed_texts, [scored_text])
            embedding = embedded[0] if embedded is not None else None
        models: dict[str, dict[str, Any]] = {}
        for i, (model, result, is_client) in enumerate(sides):
            usage = usage_of(result) or {}
            price = self.services.prices.get(model)
            prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            outcome: dict[str, Any] = {
                "cost_usd": price.cost_usd(prompt, completion) if price is not None else 0.0,
                "output_tokens": completion,
                "answered": is_client,
            }
            if i == 0:  # the weak side: its logprobs and confidence
                outcome |= _token_logprobs(result)
                confidence = self._confidence(model, result)
                if confidence is not None:
                    outcome["confidence"] = confidence
            if label is not None and model in label.quality:
                outcome["quality"] = label.quality[model]
            models[model] = models.get(model, {}) | outcome
        row = LearningRow(
            request_id=kept.request_id,
            created_at=kept.created_at,
            team=kept.principal.team.name if kept.principal is not None else None,
            route=kept.route,
            prompt_key=prompt_key(self.hash_key, scored_text),
            models=models,
            prompt=scored_text if self.settings.store_prompts else None,
            embedding=embedding,
            features=features_of(scored_text),
            score=kept.score,
            routing_version=kept.routing_version,
            label_source=label.source if label is not None else None,
            label_detail=label.detail if label is not None else None,
        )
        await insert_row(database, row)

    def _confidence(self, model: str, result: CompletionResult) -> float | None:
        cascade = self.services.cascade
        rung = next((r for r in cascade.rungs if r.entry.name == model), None) if cascade is not None else None
        if rung is None:
            return None
        return confidence_score(rung.scorer, logprobs.evidence_of(result).evidence())


async def start_shadow(services: Services, load: Callable[[], int]) -> tuple[Shadow | None, list[SupervisedTask]]:
    """Shadow sampling on these services, its job runner and the rows' retention started as
    supervised tasks (None: `shadow.rate` is 0, or there is no database to keep rows in)."""
    settings = services.settings
    database = services.database
    if not settings.shadow.is_on:
        return None, []
    if database is None:
        logger.warning("shadow sampling is off: it keeps its rows in the database (billing.database_url)")
        return None, []
    configured = settings.shadow.hash_key.get_secret_value() if settings.shadow.hash_key is not None else None
    # the batch tier's rule, with shadow's own bound on interactive requests in flight
    rule = settings.batch.model_copy(update={"yield_at_in_flight": settings.shadow.yield_at_in_flight})
    shadow = Shadow(services, SpareCapacity(rule, services.registry, load), await hash_key(database, configured))
    tasks = [SupervisedTask("shadow", shadow.run_forever), SupervisedTask("learning-retention", shadow.prune_forever)]
    for task in tasks:
        services.background.append(task)
        task.start()
    return shadow, tasks
