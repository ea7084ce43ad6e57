"""Hands a parsed request to the backend that serves its model and relays the answer.

`decide()` (switchyard.gateway.decide) finishes before the first byte; then the cascade's own entry
point runs when it has a plan, else the resilient executor (retries, fallbacks), and the answer or
the stream is relayed. What happened comes back as one `Relayed` value, free of any web framework:
the status, the headers, the bytes of a whole answer (or of the error the client is told) or the
events of a stream, the meter of every attempt, the decision and the model and deployment that
answered. The HTTP layer (`switchyard.proxy.exchange`) and the batch tier (`switchyard.batch.runner`)
each turn it into what they send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from switchyard.backends.answered import Answered
from switchyard.backends.base import AnyRequest
from switchyard.backends.registry import ModelEntry
from switchyard.billing.ledger import Ledger
from switchyard.billing.metering import CACHE_DEPLOYMENT, RequestMeter, RequestTags, RequestTotals, Sent, usage_of
from switchyard.billing.teams import Principal
from switchyard.cache.entries import CachedAnswer
from switchyard.cascade.runtime import Plan
from switchyard.core.capabilities import needs
from switchyard.core.chat_wire import RawJSON, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import ShuttingDown, SwitchyardError
from switchyard.core.estimates import estimated_prompt_tokens
from switchyard.core.metrics import HistogramTally
from switchyard.core.prices import Price
from switchyard.core.request_context import Deadline, RequestContext
from switchyard.core.requests import GenerationRequest
from switchyard.core.tracing import annotate_request
from switchyard.gateway.answer_shape import PASS_THROUGH, AnswerShape
from switchyard.gateway.decide import Asked, Decision, decide
from switchyard.gateway.live_streams import LiveStreams
from switchyard.gateway.request_log import CLIENT_CLOSED_REQUEST
from switchyard.gateway.response_cache import Lookup, StreamKeeper, fresh_answer, replayed_chunks
from switchyard.gateway.services import Services

logger = logging.getLogger("switchyard")


@dataclass(frozen=True, slots=True)
class Relayed:
    """What the relay did with one request: a whole answer (`body`, JSON), an error (`body`, the
    error's shape; `error`), the client gone (status 499, no body), or a stream (`events`).

    A stream ends (and settles its budgets) later: whoever sends its events runs `settle` once they
    are over, however they end, even if they never started; the request is over then."""

    status: int
    started_at: float  # event-loop time the relay took the request
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    events: AsyncIterator[bytes] | None = None  # a stream's server-sent events
    settle: Callable[[], Awaitable[None]] | None = None  # with `events`: run once they are over
    meter: RequestMeter | None = None  # None: refused before metering began (a priority tier's cap)
    decision: Decision | None = None  # None: refused before routing
    answered: Answered | None = None  # None: refused, or every attempt failed
    error: SwitchyardError | None = None  # what the client was told, when the answer is an error

    @property
    def refusal(self) -> SwitchyardError | None:
        """The error, when no model was called for the request (nothing metered)."""
        if self.error is None or (self.meter is not None and self.meter.num_attempts > 0):
            return None
        return self.error

    @property
    def is_whole(self) -> bool:
        """Not a stream: the answer was whole when the relay returned it."""
        return self.events is None


def _answer_headers(answered: Answered) -> dict[str, str]:
    return {"x-switchyard-model": answered.entry.name, "x-switchyard-backend": answered.deployment}


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


@dataclass(frozen=True, slots=True)
class LineTerms:
    """How a batch's line is metered: at the batch's prices, into its own ledger (written with the
    line's result)."""

    batch_id: str
    prices: dict[str, Price]
    ledger: Ledger


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request came from: its ids, and, for a client that may leave, `client_left` (an
    awaitable that completes when it has left); a batch's line (run by the batch tier) has no
    client but its terms."""

    request_id: str
    client_request_id: str | None = None
    client_left: Callable[[], Awaitable[object]] | None = None
    terms: LineTerms | None = None
    received_at: float | None = None  # time.monotonic() when the proxy received it (None: no client, a batch's line)


def _tags(origin: Origin, parsed: AnyRequest, principal: Principal | None) -> RequestTags:
    """Who asked for what: the meter's tags from its start (how it was routed comes with `routed`)."""
    return RequestTags(
        client_request_id=origin.client_request_id,
        key_id=principal.key.id if principal is not None else None,
        requested_model=parsed.model,
        batch_id=origin.terms.batch_id if origin.terms is not None else None,
    )


def _route_of(decision: Decision) -> str | None:
    """The route the ledger records: `x-switchyard-route`, plus ";degraded"."""
    route = decision.headers.get("x-switchyard-route")
    if "x-switchyard-degraded" in decision.headers:
        route = (route or "") + ";degraded"
    return route


async def relay(
    services: Services,
    origin: Origin,
    principal: Principal | None,
    parsed: AnyRequest,
    asked: Asked,
    shape: AnswerShape = PASS_THROUGH,
) -> Relayed:
    """`shape` writes the answer (or a refusal) in the API the request came in by
    (`switchyard.gateway.answer_shape`).

    Everything before the first byte can be cancelled by the client leaving: the upstream calls
    stop, and the resilience layer meters them as cancelled. A watcher task cancels this one when
    the disconnect arrives; a cancellation that did not come from it (server shutdown) propagates."""
    this = asyncio.current_task()
    assert this is not None
    started_at = asyncio.get_running_loop().time()
    spending = services.budgets.open(principal, origin.request_id)
    release = services.tier_slots.enter(principal, parsed)  # a priority tier's caps: refused before metering
    if release is not None:
        spending.on_settle(release)
    team = principal.team if principal is not None else None
    terms = origin.terms
    meter = RequestMeter(
        terms.ledger if terms is not None else services.ledger,
        terms.prices if terms is not None else services.prices,
        origin.request_id,
        services.attempt_counts,
        prompt_tokens_estimate=estimated_prompt_tokens(parsed),
        team=team.name if team is not None else None,
        spending=spending,
        metrics=services.metrics,
        totals=RequestTotals(received_at=origin.received_at),
        tags=_tags(origin, parsed, principal),
    )
    annotate_request(requested_model=parsed.model, stream=bool(parsed.stream))
    ctx = RequestContext(meter.request_id, meter, principal)
    decision: Decision | None = None
    relayed: Relayed | None = None
    left: list[bool] = []
    watcher = asyncio.ensure_future(_cancel_when(origin.client_left, this, left)) if origin.client_left else None
    try:
        decision = await decide(services, parsed, ctx, asked, needs(parsed))
        # the deadline, once: from the start, by the model that answers first
        ctx = replace(ctx, deadline=Deadline.after(started_at, services.executor.request_timeout_s(decision.entry)))
        meter.routed(
            _route_of(decision),
            decision.score,
            decision.ceiling,
            decision.routing.version if decision.routing is not None else None,
        )
        lookup = await _look_up(services, parsed, decision, team.name if team is not None else None, asked)
        if lookup is not None and lookup.hit is not None:
            relayed = _from_cache(services, lookup, lookup.hit, parsed, meter, decision, shape, started_at)
            return relayed
        if lookup is not None:
            meter.cache_looked_up(lookup.result)
        keeping = lookup if lookup is not None and lookup.keys is not None else None
        answer, answered = await _execute(services, decision, parsed, ctx, shape, keeping)
        if lookup is not None:
            _count_cache(services, lookup, decision, team.name if team is not None else None, 0.0)
            answer.headers.update(lookup.header())
            if keeping is not None and answer.is_whole and answer.status == 200:
                _keep_whole(services, keeping, answered, meter)
        relayed = replace(answer, started_at=started_at, meter=meter, decision=decision, answered=answered)
        return relayed
    except SwitchyardError as exc:
        status, body = shape.refusal_status(exc), shape.refusal(exc)
        return Relayed(status, started_at, body, exc.headers(), meter=meter, decision=decision, error=exc)
    except asyncio.CancelledError:
        if not left or this.cancelling() > 1:
            raise
        this.uncancel()
        logger.info("the client left before the first byte; its request was cancelled")
        return Relayed(CLIENT_CLOSED_REQUEST, started_at, meter=meter, decision=decision)
    finally:
        if watcher is not None:
            watcher.cancel()
        if relayed is None or relayed.events is None:  # a stream settles when it ends
            spending.settle()


async def _cancel_when(client_left: Callable[[], Awaitable[object]], task: asyncio.Task, left: list[bool]) -> None:
    """Cancel `task` (the relay's) when the client has left, saying so in `left`."""
    await client_left()
    left.append(True)
    task.cancel()


async def _look_up(
    services: Services, parsed: AnyRequest, decision: Decision, team: str | None, asked: Asked
) -> Lookup | None:
    """The response cache's lookup (None: it has nothing to do with this request)."""
    cache = services.response_cache
    if cache is None or decision.entry.kind != "chat":
        return None
    return await cache.look_up(parsed, parsed.model, decision.entry.name, team, client_refuses=asked.refuses_cache)


def _count_cache(services: Services, lookup: Lookup, decision: Decision, team: str | None, saved_usd: float) -> None:
    services.metrics.response_cache_done(lookup.result, team, _cache_route(decision), saved_usd)


def _cache_route(decision: Decision) -> str:
    """The route /metrics counts the cache's results by: auto, cascade, or the model asked for."""
    route = decision.headers.get("x-switchyard-route", "")
    for entry_point in ("auto", "cascade"):
        if route.startswith(entry_point):
            return entry_point
    return decision.entry.name


def _stream_keeper(services: Services, keeping: Lookup | None, answered: Answered) -> StreamKeeper | None:
    if keeping is None or services.response_cache is None:
        return None
    return StreamKeeper(services.response_cache, keeping, answered.entry.name, answered.deployment)


def _keep_whole(services: Services, keeping: Lookup, answered: Answered, meter: RequestMeter) -> None:
    assert services.response_cache is not None
    result = answered.whole
    services.response_cache.keep(
        keeping,
        result.data,
        model=answered.entry.name,
        deployment=answered.deployment,
        usage=usage_of(result),
        cost_usd=meter.total_cost_usd,
    )


def _from_cache(
    services: Services,
    lookup: Lookup,
    hit: CachedAnswer,
    parsed: AnyRequest,
    meter: RequestMeter,
    decision: Decision,
    shape: AnswerShape,
    started_at: float,
) -> Relayed:
    """The answer the cache kept, as a new answer: whole, or replayed as the stream it would have been."""
    assert services.response_cache is not None
    entry = services.registry.find(hit.model) or decision.entry
    saved_tokens = hit.prompt_tokens + hit.completion_tokens
    cost = services.response_cache.policy.hit_cost_usd(saved_tokens)
    team = meter.team
    _count_cache(services, lookup, decision, team, hit.cost_usd)
    answer = fresh_answer(hit)
    headers = (
        {"x-switchyard-model": hit.model, "x-switchyard-backend": CACHE_DEPLOYMENT}
        | decision.headers
        | lookup.header()
        | {"x-switchyard-cost-usd": f"{cost:.8f}"}
    )

    def metered(sent: Sent) -> None:
        meter.from_cache(entry, cost_usd=cost, saved_tokens=saved_tokens, saved_usd=hit.cost_usd, sent=sent)

    if not parsed.stream:
        body = shape.whole(orjson.dumps(answer))
        metered("whole")
        return Relayed(200, started_at, body, headers, meter=meter, decision=decision)
    events = _replayed(answer, parsed, shape, meter, cost, metered)

    async def settle() -> None:
        await events.aclose()  # type: ignore[attr-defined]
        metered("stream")  # a client gone before the replay began: still its answer
        if meter.spending is not None:
            meter.spending.settle()

    return Relayed(200, started_at, headers=headers, events=events, settle=settle, meter=meter, decision=decision)


async def _replayed(
    answer: dict[str, Any],
    parsed: AnyRequest,
    shape: AnswerShape,
    meter: RequestMeter,
    cost_usd: float,
    metered: Callable[[Sent], None],
) -> AsyncIterator[bytes]:
    include_usage = _client_wants_usage(parsed)
    try:
        for chunk in replayed_chunks(answer):
            shaped: StreamChunk | None = chunk
            if chunk.has_usage:
                usage = chunk.parsed["usage"]
                shaped = (
                    StreamChunk.from_dict({**chunk.parsed, "usage": {**usage, "cost_usd": round(cost_usd, 10)}})
                    if include_usage
                    else _without_usage(chunk)
                )
            if shaped is not None:
                for event in shape.events(shaped):
                    meter.first_byte()
                    yield event
    finally:
        metered("stream")
    meter.first_byte()
    yield shape.end()


async def _execute(
    services: Services,
    decision: Decision,
    parsed: AnyRequest,
    ctx: RequestContext,
    shape: AnswerShape,
    keeping: Lookup | None = None,
) -> tuple[Relayed, Answered]:
    if decision.plan is not None and not isinstance(parsed, EmbeddingRequest):
        return await _relay_cascade(services, decision, decision.plan, parsed, ctx, shape, keeping)
    meter = ctx.meter
    if parsed.stream:
        # Decide before the first byte: retries, fallbacks and errors up to the first chunk are real
        # HTTP outcomes; after it, only in-band errors remain.
        opened = await services.executor.stream(decision.entry, parsed, ctx, decision.needed)
        headers = _answer_headers(opened) | _upstream_model_header(opened.first) | decision.headers
        keeper = _stream_keeper(services, keeping, opened)
        return _stream(opened, parsed, meter, headers, services.streams, shape, keeper), opened
    answer = await services.executor.complete(decision.entry, parsed, ctx, decision.needed)
    result = answer.whole
    meter.finished(
        answer.entry, "completed", usage_of(result), answer.num_chunks, deployment=answer.deployment, sent="whole"
    )
    body = shape.whole(result.data)
    headers = _answer_headers(answer) | _upstream_model_header(result) | decision.headers | _cost_header(meter)
    return _whole(body, headers), answer


async def _relay_cascade(
    services: Services,
    decision: Decision,
    plan: Plan,
    parsed: GenerationRequest,
    ctx: RequestContext,
    shape: AnswerShape,
    keeping: Lookup | None = None,
) -> tuple[Relayed, Answered]:
    """The cascade meters each rung's attempt itself, cancellations included; the answer's is finished
    here. The cascade is the one of the routing version that made the plan."""
    assert decision.routing is not None and decision.routing.cascade is not None
    route_headers = decision.headers
    answered, meter = await decision.routing.cascade.run(plan, parsed, ctx)
    assert answered.cascade is not None
    headers = (
        _answer_headers(answered)
        | _upstream_model_header(answered.result if not parsed.stream else answered.first)
        | route_headers
        | {"x-switchyard-cascade": answered.cascade}
    )
    if parsed.stream:
        keeper = _stream_keeper(services, keeping, answered)
        return _stream(answered, parsed, meter, headers, services.streams, shape, keeper), answered
    result = answered.whole
    usage = usage_of(result)
    meter.finished(
        answered.entry, "completed", usage, answered.num_chunks, deployment=answered.deployment, sent="whole"
    )
    body = shape.whole(result.data)
    return _whole(body, headers | _cost_header(ctx.meter)), answered


def _whole(body: bytes, headers: dict[str, str]) -> Relayed:
    """A whole answer (when it was relayed, its meter and decision are filled in by `relay`)."""
    return Relayed(200, 0.0, body, headers)


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
    cost = meter.total_cost_usd + meter.usage_cost_usd(entry.name, usage)
    return StreamChunk.from_dict({**chunk.parsed, "usage": {**usage, "cost_usd": round(cost, 10)}})


def _stream(
    answered: Answered,
    parsed: AnyRequest,
    meter: RequestMeter,
    headers: dict[str, str],
    streams: LiveStreams,
    shape: AnswerShape,
    keeper: StreamKeeper | None = None,
) -> Relayed:
    first, rest = answered.first, answered.chunks
    include_usage = _client_wants_usage(parsed)
    body = _sse_body(
        first,
        rest,
        include_usage=include_usage,
        meter=meter,
        answered=answered,
        streams=streams,
        shape=shape,
        keeper=keeper,
    )
    entry, deployment = answered.entry, answered.deployment

    async def settle() -> None:
        # A body cut off while it waited to send (a slow reader who left): closing it runs its
        # `finally`, which meters the chunks it really sent. A client gone before the body started
        # (Starlette cancels it unstarted): its `finally` never ran, so meter the attempt and close
        # the upstream here. Otherwise a no-op.
        await body.aclose()  # type: ignore[attr-defined]
        if not meter.is_closed:
            num_chunks = 1 if first is not None else 0
            meter.finished(entry, "cancelled", None, num_chunks, deployment=deployment, sent="stream")
            if meter.spending is not None:
                meter.spending.settle()
            await rest.aclose()  # type: ignore[attr-defined]

    return Relayed(200, 0.0, headers=headers, events=body, settle=settle)


async def _sse_body(
    first: StreamChunk | None,
    rest: AsyncIterator[StreamChunk],
    *,
    include_usage: bool,
    meter: RequestMeter,
    answered: Answered,
    streams: LiveStreams,
    shape: AnswerShape,
    keeper: StreamKeeper | None = None,
) -> AsyncIterator[bytes]:
    entry = answered.entry
    usage, num_chunks, status, error = None, 0, "cancelled", None  # unless the loop below ends otherwise
    this = asyncio.current_task()
    assert this is not None
    streams.add(this)
    loop = asyncio.get_running_loop()
    gaps = HistogramTally(meter.metrics.inter_token.labels(entry.name)) if meter.metrics is not None else None
    last_at: float | None = None
    try:
        chunk: StreamChunk | None = first
        while chunk is not None:
            num_chunks += 1
            now = loop.time()
            if gaps is not None and last_at is not None:
                gaps.add(now - last_at)
            last_at = now
            if keeper is not None:
                keeper.add(chunk)
            if chunk.has_usage:
                usage = chunk.parsed["usage"]
                chunk = _with_cost(chunk, meter, entry) if include_usage else _without_usage(chunk)
            if chunk is not None:
                for event in shape.events(chunk):
                    meter.first_byte()
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
        if gaps is not None:
            gaps.flush()
        meter.finished(entry, status, usage, num_chunks, error, deployment=answered.deployment, sent="stream")
        if meter.spending is not None:
            meter.spending.settle()
        await rest.aclose()  # type: ignore[attr-defined]
    if keeper is not None and status == "completed":
        keeper.keep(meter.total_cost_usd)
    meter.first_byte()  # an empty stream's first byte is its end
    yield shape.end()
