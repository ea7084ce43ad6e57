"""One API request from its handler's first line to its last byte, and the one place it ends: the
request count (`switchyard_requests_total` and the duration histograms), its refusal (the count by
reason and, for a known caller, its one ledger record) and the request log's line, all from values
the handler got back along the way (the caller, the parsed request, the relay's `Relayed`), never
read back from the response or the ASGI scope.

- Model requests (`serve_model_request`): chat completions, completions, responses.
- Every other `/v1/` endpoint (`LoggedRoute`: a log line).
- A `/v1/` path or method nothing serves (`not_routed`: the 404 or 405, logged, and counted when
  the path is a model's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from switchyard.backends.base import AnyRequest
from switchyard.billing.directory import UnknownKey
from switchyard.billing.metering import RequestMeter
from switchyard.billing.refusals import refusal_reason, refusal_record
from switchyard.billing.teams import Principal
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import SwitchyardError
from switchyard.core.metrics import route_of
from switchyard.core.protocol import ChatCompletionRequest, CompletionRequest
from switchyard.core.responses_wire import ResponsesRequest
from switchyard.core.tracing import annotate_request
from switchyard.proxy.access import authenticate, saturation_priority
from switchyard.proxy.answer_shape import PASS_THROUGH, AnswerShape, error_response
from switchyard.proxy.body import read_request
from switchyard.proxy.decide import Asked
from switchyard.proxy.relay import Origin, Relayed, relay
from switchyard.proxy.request_log import CLIENT_CLOSED_REQUEST, RequestLine, write_line
from switchyard.proxy.services import Services, services_of

MODEL_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"))
AUTO_NAMES = ("auto", "cascade")

W = TypeVar("W", ChatCompletionRequest, CompletionRequest, ResponsesRequest, EmbeddingRequest)
# How an API's request becomes the chat path's request, and how its answer is written.
Prepare = Callable[[Any, Services], tuple[AnyRequest, AnswerShape]]


def _as_it_came(parsed: Any, services: Services) -> tuple[AnyRequest, AnswerShape]:
    return parsed, PASS_THROUGH


def _line(request: Request) -> RequestLine:
    scope = request.scope  # read as it is: `request.url` and `request.state` build objects to read it
    state = scope["state"]
    return RequestLine(
        request_id=state["request_id"],
        method=scope["method"],
        path=scope["path"],
        started_at=time.time(),
        client_request_id=state["client_request_id"],
    )


def _note_caller(line: RequestLine, principal: Principal | None) -> None:
    if principal is not None:
        line.team, line.key_id = principal.team.name, principal.key.id
        annotate_request(team=principal.team.name)


async def serve_model_request(request: Request, wire: type[W], prepare: Prepare = _as_it_came) -> Response:
    """Authenticate, read and validate the body, relay it; end the request (counted, logged) when
    its response is over, whatever ends it: the answer, a refusal, the client leaving, a bug."""
    services = services_of(request)
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    received_at = time.monotonic()  # the clock of the meter's stamps (the client-seen times)
    line = _line(request)
    relayed: Relayed | None = None
    refused: SwitchyardError | None = None  # before the relay took it
    try:
        try:
            principal = authenticate(services, request)  # before the body: a caller without a key learns that first
            _note_caller(line, principal)
            asked = await read_request(request, wire, services.settings.server)
            line.requested_model, line.is_stream = asked.model, bool(asked.stream)
            parsed, shape = prepare(asked, services)
            if services.settings.logging.prompts:
                line.prompt = parsed.model_dump(mode="json", include={"messages", "prompt"}, exclude_none=True)
            routing = Asked(
                quality=request.headers.get("x-switchyard-quality"),
                cascade_mode=request.headers.get("x-switchyard-cascade"),
                priority=saturation_priority(services, request, principal),
            )
            state = request.scope["state"]
            origin = Origin(state["request_id"], state["client_request_id"], request, received_at=received_at)
            relayed = await relay(services, origin, principal, parsed, routing, shape)
            response, status = relayed.response, relayed.status
        except SwitchyardError as exc:
            line.requested_model = line.requested_model or exc.requested_model
            response, status, refused = error_response(exc), exc.status_code, exc
    except BaseException as exc:  # the client left (499), the server is stopping, or a bug (500)
        cut = isinstance(exc, asyncio.CancelledError | ClientDisconnect)
        end_exchange(services, line, relayed, CLIENT_CLOSED_REQUEST if cut else 500, started_at)
        raise

    def end() -> None:
        nonlocal relayed
        refusal = end_exchange(services, line, relayed, status, started_at, refused=refused)
        if refusal is not None:
            _meter_refusal(services, line, refusal)
        # `relayed` holds the response, whose background holds this function: let go of it, and the
        # request's objects are freed at once, not left to the garbage collector as a cycle
        relayed = None

    response.background = _then(response.background, end)
    return response


def _then(background: BackgroundTask | None, end: Callable[[], None]) -> BackgroundTask:
    """`background` (a stream's settlement), then `end`, however the first ends."""

    async def run() -> None:
        try:
            if background is not None:
                await background()
        finally:
            end()

    return BackgroundTask(run)


def end_exchange(
    services: Services,
    line: RequestLine,
    relayed: Relayed | None,
    status: int,
    started_at: float,
    *,
    refused: SwitchyardError | None = None,
) -> SwitchyardError | None:
    """The request is over: counted once, and its line written. `refused`: the error that ended it
    before the relay took it. Returns the refusal, when no model was called for it."""
    now = asyncio.get_running_loop().time()
    line.status = status
    refusal = relayed.refusal if relayed is not None else refused
    if relayed is not None:
        _count_relayed(services, line, relayed, now - relayed.started_at)
    else:
        _count_refused(services, line.requested_model or "", status)
    if refusal is not None:
        services.metrics.refused(line.team, refusal_reason(refusal))
    if services.settings.logging.requests:
        write_line(line, now - started_at, services.settings.logging.format)
    return refusal


def _meter_refusal(services: Services, line: RequestLine, refusal: SwitchyardError) -> None:
    """A known caller's refusal, in the ledger once (a caller without a valid key has no team)."""
    if services.ledger is None or line.team is None:
        return
    services.ledger.record(
        refusal_record(
            request_id=line.request_id,
            reason=refusal_reason(refusal),
            started_at=line.started_at,
            duration_ms=max(time.time() - line.started_at, 0.0) * 1000,
            team=line.team,
            key_id=line.key_id,
            requested_model=line.requested_model,
            client_request_id=line.client_request_id,
        )
    )


def _count_relayed(services: Services, line: RequestLine, relayed: Relayed, duration_s: float) -> None:
    registry, metrics = services.registry, services.metrics
    decision, answered, meter = relayed.decision, relayed.answered, relayed.meter
    requested = line.requested_model or ""
    if meter is not None:
        line.totals = meter.totals
        _count_seen(services, line, relayed, meter)
    if decision is not None:
        line.route = decision.headers.get("x-switchyard-route")
        cascade = answered.cascade if answered is not None else None
        line.cascade = cascade or decision.headers.get("x-switchyard-cascade")
    if answered is not None:
        model, backend = answered.entry.name, answered.deployment
        line.model, line.backend = model, backend
    elif decision is not None:
        model, backend = decision.entry.name, decision.entry.backend_kind
    else:  # refused before routing
        model, backend = model_label(services, requested), ""
    entry = registry.find(model)
    is_cascade = decision is not None and decision.plan is not None
    if decision is not None and answered is not None and answered.entry is not decision.entry and not is_cascade:
        metrics.fell_back(decision.entry.name, answered.entry.name)  # one of the routed model's fallbacks answered
    tier = (entry.tier or "") if entry is not None else ""
    if relayed.refusal is not None:  # no model was called: no duration
        metrics.request_refused(model=model, tier=tier, route=route_of(requested), status=relayed.status)
        return
    metrics.request_done(
        model=model, backend=backend, tier=tier, route=route_of(requested), status=relayed.status, duration_s=duration_s
    )
    if relayed.is_whole and not is_cascade and meter is not None and meter.upstream_s > 0:
        metrics.overhead.observe(max(duration_s - meter.upstream_s, 0.0))


def _count_seen(services: Services, line: RequestLine, relayed: Relayed, meter: RequestMeter) -> None:
    """The request as its client saw it, once it reached a model: routed requests counted by how
    they ended; time to the first and the last byte of its answer by route (a client's request
    only: a batch's line has none). A whole answer is one write, sent before this runs."""
    totals = meter.totals
    ttfb_s: float | None = None
    ttlb_s: float | None = None
    if totals.received_at is not None and relayed.status != CLIENT_CLOSED_REQUEST:
        ttlb_s = time.monotonic() - totals.received_at
        if relayed.is_whole:
            ttfb_s = ttlb_s
        elif totals.first_byte_at is not None:
            ttfb_s = totals.first_byte_at - totals.received_at
    line.ttfb_s = ttfb_s
    if meter.num_attempts > 0:
        services.metrics.request_seen(
            requested_model=line.requested_model or "", escalation=totals.escalation, ttfb_s=ttfb_s, ttlb_s=ttlb_s
        )


def model_label(services: Services, requested: str) -> str:
    """The `model` label for a request that named `requested` and was refused before a model was
    picked: that name if it is configured (or auto, cascade), else "" (never a client's free text)."""
    return requested if requested in AUTO_NAMES or services.registry.find(requested) is not None else ""


def _count_refused(services: Services, requested: str, status: int) -> None:
    """A model request that ended before the relay took it: counted, with the labels the relay gives
    its own refusals; no backend, no duration (it never ran)."""
    entry = services.registry.find(requested)
    services.metrics.request_refused(
        model=model_label(services, requested),
        tier=(entry.tier or "") if entry is not None else "",
        route=route_of(requested),
        status=status,
    )


class LoggedRoute(APIRoute):
    """A `/v1/` endpoint other than a model's: its request-log line, when its response is over."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def logged(request: Request) -> Response:
            services = services_of(request)
            if not services.settings.logging.requests:
                return await handler(request)
            loop = asyncio.get_running_loop()
            started_at = loop.time()
            line = _line(request)
            _note_caller(line, _identify(services, request))
            form = services.settings.logging.format
            try:
                response = await handler(request)
            except BaseException as exc:
                cut = isinstance(exc, asyncio.CancelledError | ClientDisconnect)
                line.status = CLIENT_CLOSED_REQUEST if cut else getattr(exc, "status_code", 500)
                write_line(line, loop.time() - started_at, form)
                raise
            line.status = response.status_code

            def end() -> None:
                write_line(line, loop.time() - started_at, form)

            response.background = _then(response.background, end)
            return response

        return logged


def _identify(services: Services, request: Request) -> Principal | None:
    """The caller, for the log line only (the endpoint authenticates for itself)."""
    try:
        return services.directory.authenticate(request.headers.get("authorization"))
    except UnknownKey:
        return None


def not_routed(request: Request, status: int) -> None:
    """Under /v1/, a path nothing serves (404) or a method its route does not serve (405): logged,
    and counted when the path is a model's (the router's own refusals, see `error_handlers`)."""
    services = services_of(request)
    line = _line(request)
    line.status = status
    if request.url.path in MODEL_PATHS:
        _count_refused(services, "", status)
        services.metrics.refused(None, "method_not_allowed" if status == 405 else "unknown_url")
    if services.settings.logging.requests:
        write_line(line, 0.0, services.settings.logging.format)
