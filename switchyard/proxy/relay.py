"""Hands a parsed request to the backend that serves its model and relays the answer.

Two steps a request goes through, in this order:

- `decide()`: the team's budget, then the route (`auto`), the cascade's first rung (`cascade`) or
  the named model, then saturation admission, then the cascade's plan when the admitted model is
  a rung. Everything here finishes before the first byte.
- `execute()`: the cascade's own entry point when it has a plan, else the resilient executor
  (retries, fallbacks), then the answer or the stream is relayed and each attempt metered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from switchyard.backends.base import AnyRequest, answered_by
from switchyard.backends.registry import ModelEntry
from switchyard.billing.context import RequestContext
from switchyard.billing.limits.errors import RateLimitExceeded
from switchyard.billing.metering import RequestMeter, RequestTags, usage_of
from switchyard.billing.teams import Principal, Team
from switchyard.cascade.runtime import Plan
from switchyard.core.capabilities import needs, unsupported
from switchyard.core.errors import ModelNotAllowed, SwitchyardError
from switchyard.core.estimates import estimated_prompt_tokens, worst_case_tokens
from switchyard.core.metrics import route_of
from switchyard.core.protocol import RawJSON, StreamChunk
from switchyard.proxy.access import saturation_priority
from switchyard.proxy.answer_shape import PASS_THROUGH, AnswerShape
from switchyard.proxy.request_count import model_label, note_counted
from switchyard.proxy.request_log import CLIENT_CLOSED_REQUEST, note_request
from switchyard.proxy.routing import CASCADE_MODEL, auto_not_configured, cascade_not_configured
from switchyard.proxy.streams import LiveStreams, ShuttingDown

if TYPE_CHECKING:
    from switchyard.proxy.services import Services

logger = logging.getLogger("switchyard")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _answer_headers(entry: ModelEntry, backend: str | None = None) -> dict[str, str]:
    return {
        "x-switchyard-model": entry.name,
        "x-switchyard-backend": backend or answered_by.get() or entry.backend_kind,
    }


def _upstream_model_header(answer: RawJSON | None) -> dict[str, str]:
    """The upstream's own name for the model that answered, when it gave one (for a stream: in its
    first chunk, which has arrived before the headers go); left out rather than sent unsafe."""
    name = answer.upstream_model if answer is not None else None
    if not name or not name.isascii() or not name.isprintable():
        return {}
    return {"x-switchyard-upstream-model": name}


def _cost_header(meter: RequestMeter) -> dict[str, str]:
    """The whole request's cost: every attempt, escalations and retries included."""
    return {"x-switchyard-cost-usd": f"{meter.total_cost_usd:.8f}"}


@dataclass(slots=True)
class Decision:
    """Where a request goes, and why (the headers that explain it)."""

    entry: ModelEntry
    headers: dict[str, str]
    plan: Plan | None = None  # the cascade's rungs, when the cascade answers
    score: float | None = None  # the classifier's (auto)
    ceiling: str | None = None  # the strongest model the route could have reached (auto, cascade)
    needed: dict[str, str] | None = None  # what the request needs of a model (`needs()`), computed once


def _allowed(team: Team | None, entry: ModelEntry, asked_for: str) -> ModelEntry:
    if team is not None and not team.may_use(entry.name):
        raise ModelNotAllowed(f"Team '{team.name}' may not use model '{asked_for}'.", param="model")
    return entry


async def decide(request: Request, parsed: AnyRequest, ctx: RequestContext) -> Decision:
    """Rate limits, the caller's budget, routing (for "auto") or the cascade's first rung that can
    serve the request (for "cascade"), the named model's capabilities, saturation admission, the
    worst-case reservation, then the cascade's plan. A request no model may serve is refused here,
    before any call: like every 400 before a call, it is not metered."""
    state = request.app.state.services
    principal, team = ctx.principal, ctx.team
    try:
        rate = await state.budgets.check_rate(principal, worst_case_tokens(parsed))
    except RateLimitExceeded as exc:
        state.metrics.rate_limit_refused(team.name if team is not None else None, exc.limit)
        raise
    headers: dict[str, str] = rate.headers() if rate is not None else {}
    # Only "auto" routes by what is left; everything else is held to its reservation below.
    headroom = await state.budgets.headroom(principal) if parsed.model == "auto" else None
    is_near = False
    score = ceiling = None
    needed = needs(parsed)
    if parsed.model == "auto":
        if state.auto_router is None:
            raise auto_not_configured()
        quality = request.headers.get("x-switchyard-quality")
        decision = await state.auto_router.route(parsed, quality, team, headroom, needed)
        entry, score = decision.entry, decision.score
        ceiling = state.auto_router.strongest(team).name
        headers["x-switchyard-route"] = decision.reason
        if decision.score is not None:
            headers["x-switchyard-score"] = f"{decision.score:.4f}"
        margin = state.cascade.policy.hedge_margin if state.cascade is not None else None
        is_near = margin is not None and decision.margin is not None and decision.margin <= margin
    elif parsed.model == CASCADE_MODEL:
        if state.cascade is None:
            raise cascade_not_configured()
        _allowed(team, state.cascade.rungs[0].entry, CASCADE_MODEL)  # the cascade is the team's if its first rung is
        first, notes = state.cascade.first_capable(needed)
        entry = _allowed(team, first, CASCADE_MODEL)
        headers["x-switchyard-route"] = f"cascade->{entry.name}" + "".join(notes)
    else:
        entry = _allowed(team, state.registry.get(parsed.model), parsed.model)
        lacking = entry.capabilities.lacks(needed)
        if lacking:
            raise unsupported(entry.name, lacking)
    admission = await state.saturation.admit(entry, saturation_priority(request, principal), ctx, needed)
    if admission.is_degraded:
        headers["x-switchyard-degraded"] = "1"
    if not await ctx.reserve_for(admission.entry.name, parsed):
        cost = ctx.worst_case_cost_usd(admission.entry.name, parsed)
        raise await state.budgets.refusal(principal, (cost, admission.entry.name))
    plan = None
    if state.cascade is not None and parsed.model in ("auto", CASCADE_MODEL):
        mode = request.headers.get("x-switchyard-cascade")
        planned = state.cascade.plan(admission.entry, parsed, mode, is_near, ctx, needed)
        if isinstance(planned, str):
            headers["x-switchyard-cascade"] = planned
        else:
            plan = planned
            if parsed.model == CASCADE_MODEL or ceiling is None:
                ceiling = plan.rungs[-1].entry.name
    if parsed.model == CASCADE_MODEL and ceiling is None:
        ceiling = admission.entry.name
    return Decision(admission.entry, headers, plan, score, ceiling, needed)


def _tags(request: Request, parsed: AnyRequest, decision: Decision, principal: Principal | None) -> RequestTags:
    route = decision.headers.get("x-switchyard-route")
    if "x-switchyard-degraded" in decision.headers:
        route = (route or "") + ";degraded"
    return RequestTags(
        client_request_id=request.scope["state"].get("client_request_id"),
        key_id=principal.key.id if principal is not None else None,
        requested_model=parsed.model,
        route=route,
        score=decision.score,
        ceiling_model=decision.ceiling,
    )


async def relay(
    request: Request, principal: Principal | None, parsed: AnyRequest, shape: AnswerShape = PASS_THROUGH
) -> Response:
    """`shape` writes the answer in the API the request came in by (`switchyard.proxy.answer_shape`).

    Everything before the first byte can be cancelled by the client leaving: the upstream calls
    stop, and their own handlers meter them as cancelled. A watcher task cancels this one when the
    disconnect arrives; a cancellation that did not come from it (server shutdown) propagates."""
    this = asyncio.current_task()
    assert this is not None
    left: list[bool] = []
    watcher = asyncio.ensure_future(_cancel_when_client_leaves(request, this, left))
    try:
        return await _respond(request, parsed, principal, shape)
    except asyncio.CancelledError:
        if not left or this.cancelling() > 1:
            raise
        this.uncancel()
        logger.info("the client left before the first byte; its request was cancelled")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        watcher.cancel()


async def _cancel_when_client_leaves(request: Request, task: asyncio.Task, left: list[bool]) -> None:
    """The request body has been read already: the next message can only be the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    left.append(True)
    task.cancel()


async def _respond(request: Request, parsed: AnyRequest, principal: Principal | None, shape: AnswerShape) -> Response:
    state = request.app.state.services
    spending = state.budgets.open(principal)
    release = state.tier_slots.enter(principal, parsed)
    if release is not None:
        spending.on_settle(release)
    team = principal.team if principal is not None else None
    meter = RequestMeter(
        state.ledger,
        state.prices,
        request.scope["state"]["request_id"],
        state.attempt_counts,
        prompt_tokens_estimate=estimated_prompt_tokens(parsed),
        team=team.name if team is not None else None,
        spending=spending,
        metrics=state.metrics,
    )
    note_request(request.scope, meter, parsed)
    started_at = asyncio.get_running_loop().time()
    deadline = _deadline(started_at, state.settings.resilience.request_timeout_s)
    ctx = RequestContext(meter.request_id, meter, principal, deadline)
    response: Response | None = None
    decision: Decision | None = None
    status = 500
    try:
        decision = await decide(request, parsed, ctx)
        # the model that answers first may have a deadline of its own
        ctx = replace(ctx, deadline=_deadline(started_at, state.executor.request_timeout_s(decision.entry)))
        meter.tags = _tags(request, parsed, decision, principal)
        response = await execute(state, decision, parsed, ctx, shape)
        status = response.status_code
        return response
    except asyncio.CancelledError:
        status = CLIENT_CLOSED_REQUEST
        raise
    except Exception as exc:
        status = getattr(exc, "status_code", 500)
        raise
    finally:
        note_counted(request.scope)
        done = RequestDone(state, parsed, decision, response, status, started_at, meter)
        if isinstance(response, StreamingResponse):  # a stream settles, and is counted, when it ends
            response.background = BackgroundTask(done.after, response.background)
        else:
            spending.settle()
            done.record()


@dataclass(slots=True)
class RequestDone:
    """Counts one request in the app's metrics, once, when it has ended (a stream: at its end)."""

    state: Services
    parsed: AnyRequest
    decision: Decision | None
    response: Response | None
    status: int
    started_at: float
    meter: RequestMeter

    async def after(self, background: BackgroundTask | None) -> None:
        try:
            if background is not None:
                await background()
        finally:
            self.record()

    def record(self) -> None:
        metrics = self.state.metrics
        duration_s = asyncio.get_running_loop().time() - self.started_at
        headers = self.response.headers if self.response is not None else {}
        entry = self.decision.entry if self.decision is not None else None
        if "x-switchyard-model" in headers:
            model = headers["x-switchyard-model"]
            backend = headers.get("x-switchyard-backend", "")
        elif entry is not None:
            model, backend = entry.name, entry.backend_kind
        else:  # refused before routing
            model, backend = model_label(self.state.registry, self.parsed.model), ""
        answered = self.state.registry.find(model)
        tier = (answered.tier or "") if answered is not None else ""
        is_cascade = self.decision is not None and self.decision.plan is not None
        if entry is not None and answered is not None and answered.name != entry.name and not is_cascade:
            metrics.fell_back(entry.name, answered.name)  # one of the routed model's fallbacks answered
        metrics.request_done(
            model=model,
            backend=backend,
            tier=tier,
            route=route_of(self.parsed.model),
            status=self.status,
            duration_s=duration_s,
        )
        is_plain = self.response is not None and not isinstance(self.response, StreamingResponse)
        if is_plain and (self.decision is None or self.decision.plan is None) and self.meter.upstream_s > 0:
            metrics.overhead.observe(max(duration_s - self.meter.upstream_s, 0.0))


def _deadline(started_at: float, timeout_s: float | None) -> float | None:
    return started_at + timeout_s if timeout_s is not None else None


async def execute(
    state, decision: Decision, parsed: AnyRequest, ctx: RequestContext, shape: AnswerShape = PASS_THROUGH
) -> Response:
    entry, route_headers, meter = decision.entry, decision.headers, ctx.meter
    if decision.plan is not None:
        return await _relay_cascade(state, decision.plan, parsed, route_headers, ctx, shape)
    if parsed.stream:
        return await _relay_stream(state, entry, parsed, route_headers, ctx, shape, decision.needed)
    try:
        entry, result = await state.executor.complete(entry, parsed, ctx, decision.needed)
    except asyncio.CancelledError:
        meter.finished(meter.current_entry or entry, "cancelled", None)
        raise
    meter.finished(entry, "completed", usage_of(result), meter.num_chunks)
    headers = _answer_headers(entry) | _upstream_model_header(result) | route_headers | _cost_header(meter)
    return Response(shape.whole(result.data), media_type="application/json", headers=headers)


async def _relay_cascade(
    state, plan: Plan, parsed: AnyRequest, route_headers: dict[str, str], ctx: RequestContext, shape: AnswerShape
):
    """The cascade meters each rung's attempt itself, cancellations included; the answer's is finished here."""
    outcome = await state.cascade.run(plan, parsed, ctx)
    headers = (
        _answer_headers(outcome.entry, outcome.meter.backend_label)
        | _upstream_model_header(outcome.result if not parsed.stream else outcome.first)
        | route_headers
        | {"x-switchyard-cascade": outcome.header}
    )
    if not parsed.stream:
        outcome.meter.finished(outcome.entry, "completed", usage_of(outcome.result), outcome.meter.num_chunks)
        body = shape.whole(outcome.result.data)
        return Response(body, media_type="application/json", headers=headers | _cost_header(ctx.meter))
    return _sse_response(
        outcome.first, outcome.rest, parsed, outcome.meter, outcome.entry, headers, state.streams, shape
    )


def _client_wants_usage(parsed: AnyRequest) -> bool:
    return bool(parsed.stream_options and parsed.stream_options.include_usage)


def _without_usage(chunk: StreamChunk) -> StreamChunk | None:
    """A usage-carrying chunk as a client that did not ask for usage should see it (None: drop it)."""
    if not chunk.has_choices:
        return None
    payload = dict(chunk.parsed)
    payload.pop("usage")
    return StreamChunk.from_dict(payload)


def _with_cost(chunk: StreamChunk, meter: RequestMeter, entry: ModelEntry) -> StreamChunk:
    """The usage chunk, with what the whole request cost (this attempt's tokens included)."""
    usage = chunk.parsed["usage"]
    cost = meter.total_cost_usd + meter.cost_of(entry.name, *meter.tokens(usage, 0))
    return StreamChunk.from_dict({**chunk.parsed, "usage": {**usage, "cost_usd": round(cost, 10)}})


async def _relay_stream(
    state,
    entry: ModelEntry,
    parsed: AnyRequest,
    route_headers: dict[str, str],
    ctx: RequestContext,
    shape: AnswerShape,
    needed: dict[str, str] | None = None,
) -> Response:
    # Decide before the first byte: retries, fallbacks and errors up to the first chunk are real
    # HTTP outcomes; after it, only in-band errors remain.
    meter = ctx.meter
    try:
        entry, first, chunks = await state.executor.stream(entry, parsed, ctx, needed)
    except asyncio.CancelledError:
        meter.finished(meter.current_entry or entry, "cancelled", None)
        raise
    headers = _answer_headers(entry) | _upstream_model_header(first) | route_headers
    return _sse_response(first, chunks, parsed, meter, entry, headers, state.streams, shape)


def _sse_response(
    first: StreamChunk | None,
    rest: AsyncIterator[StreamChunk],
    parsed: AnyRequest,
    meter: RequestMeter,
    entry: ModelEntry,
    headers: dict[str, str],
    streams: LiveStreams,
    shape: AnswerShape,
) -> StreamingResponse:
    include_usage = _client_wants_usage(parsed)
    body = _sse_body(first, rest, include_usage=include_usage, meter=meter, entry=entry, streams=streams, shape=shape)

    async def settle() -> None:
        # A body cut off while it waited to send (a slow reader who left): closing it runs its
        # `finally`, which meters the chunks it really sent. A client gone before the body started
        # (Starlette cancels it unstarted): its `finally` never ran, so meter the attempt and close
        # the upstream here. Otherwise a no-op.
        await body.aclose()
        if not meter.is_closed:
            meter.finished(entry, "cancelled", None, 1 if first is not None else 0)
            if meter.spending is not None:
                meter.spending.settle()
            await rest.aclose()

    return StreamingResponse(
        body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=BackgroundTask(settle)
    )


async def _sse_body(
    first: StreamChunk | None,
    rest: AsyncIterator[StreamChunk],
    *,
    include_usage: bool,
    meter: RequestMeter,
    entry: ModelEntry,
    streams: LiveStreams,
    shape: AnswerShape,
) -> AsyncIterator[bytes]:
    usage, num_chunks, status, error = None, 0, "cancelled", None  # unless the loop below ends otherwise
    this = asyncio.current_task()
    streams.add(this)
    loop = asyncio.get_running_loop()
    gaps = meter.metrics.inter_token.labels(entry.name) if meter.metrics is not None else None
    last_at: float | None = None
    try:
        chunk: StreamChunk | None = first
        while chunk is not None:
            num_chunks += 1
            now = loop.time()
            if gaps is not None and last_at is not None:
                gaps.observe(now - last_at)
            last_at = now
            if chunk.has_usage:
                usage = chunk.parsed["usage"]
                chunk = _with_cost(chunk, meter, entry) if include_usage else _without_usage(chunk)
            if chunk is not None:
                for event in shape.events(chunk):
                    yield event
            chunk = await anext(rest, None)
        status = "completed"
    except asyncio.CancelledError:
        if not streams.is_ending(this):
            raise  # the client left, or the server gave up waiting: nothing more can be sent
        this.uncancel()  # the server is shutting down: end this stream properly, now
        error = "the server is shutting down"
        yield shape.failed(ShuttingDown("The server is shutting down; retry the request."))
    except SwitchyardError as exc:
        status, error = "failed", exc.message
        logger.warning("stream failed after the first byte: %s", exc.log_message)
        yield shape.failed(exc)
    except Exception as exc:
        status, error = "failed", f"internal error ({type(exc).__name__})"  # its words may name hosts: the log has them
        logger.exception("stream failed after the first byte")
        yield shape.failed(SwitchyardError("The server had an internal error."))
    finally:
        streams.discard(this)
        meter.finished(entry, status, usage, num_chunks, error)
        if meter.spending is not None:
            meter.spending.settle()
        await rest.aclose()
    yield shape.end()
