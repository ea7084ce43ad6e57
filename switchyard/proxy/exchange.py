"""One API request from its handler's first line to its last byte: authenticated, read, relayed
(`switchyard.gateway.relay`), the relay's `Relayed` sent as an HTTP response, and ended once that
response is over (`switchyard.gateway.request_end`: counted, refused, logged).

- Model requests (`serve_model_request`): chat completions, completions, responses, messages.
- Every other `/v1/` endpoint (`LoggedRoute`: a log line).
- A `/v1/` path or method nothing serves (`not_routed`: the 404 or 405, logged, and counted when
  the path is a model's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from switchyard.backends.base import AnyRequest
from switchyard.billing.directory import UnknownKey
from switchyard.billing.teams import Principal
from switchyard.cache.policy import client_refuses
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import SwitchyardError
from switchyard.core.messages_wire import MessagesRequest
from switchyard.core.responses_wire import ResponsesRequest
from switchyard.core.tracing import annotate_request
from switchyard.gateway.aliases import ALIAS_HEADER, alias_of
from switchyard.gateway.answer_shape import PASS_THROUGH, AnswerShape
from switchyard.gateway.decide import Asked
from switchyard.gateway.relay import Origin, Relayed, relay
from switchyard.gateway.request_end import count_refused, end_exchange, meter_refusal
from switchyard.gateway.request_log import CLIENT_CLOSED_REQUEST, RequestLine, write_line
from switchyard.gateway.response_cache import CACHE_HEADER
from switchyard.gateway.services import Services
from switchyard.proxy.app_state import services_of, shadow_of
from switchyard.proxy.auth import authenticate, authorization_of, saturation_priority
from switchyard.proxy.body import read_request
from switchyard.proxy.error_response import error_response, errors_of
from switchyard.proxy.streams import EventStreamResponse, client_left

MODEL_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"))
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

W = TypeVar("W", ChatCompletionRequest, CompletionRequest, ResponsesRequest, MessagesRequest, EmbeddingRequest)
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
    principal: Principal | None = None
    parsed: AnyRequest | None = None
    try:
        try:
            principal = authenticate(services, request)  # before the body: a caller without a key learns that first
            _note_caller(line, principal)
            asked = await read_request(request, wire, services.settings.server)
            line.requested_model, line.is_stream = asked.model, bool(asked.stream)
            parsed, shape = prepare(asked, services)
            alias = alias_of(services, parsed.model)
            if alias is not None:
                parsed.set_field("model", alias.model)
            if services.settings.logging.prompts:
                line.prompt = parsed.model_dump(mode="json", include={"messages", "prompt"}, exclude_none=True)
            routing = Asked(
                quality=request.headers.get("x-switchyard-quality") or (alias.quality if alias else None),
                cascade_mode=request.headers.get("x-switchyard-cascade"),
                priority=saturation_priority(services, request, principal),
                refuses_cache=client_refuses(request.headers.get(CACHE_HEADER), request.headers.get("cache-control")),
            )
            state = request.scope["state"]
            origin = Origin(
                state["request_id"],
                state["client_request_id"],
                partial(client_left, request.receive),
                received_at=received_at,
            )
            relayed = await relay(services, origin, principal, parsed, routing, shape)
            if alias is not None:
                relayed.headers[ALIAS_HEADER] = alias.model
            response, status = http_response(relayed), relayed.status
        except SwitchyardError as exc:
            line.requested_model = line.requested_model or exc.requested_model
            errors = errors_of(request.scope["path"])
            response, status, refused = error_response(exc, errors), errors.refusal_status(exc), exc
    except BaseException as exc:  # the client left (499), the server is stopping, or a bug (500)
        cut = isinstance(exc, asyncio.CancelledError | ClientDisconnect)
        end_exchange(services, line, relayed, CLIENT_CLOSED_REQUEST if cut else 500, started_at)
        raise

    def end() -> None:
        nonlocal relayed
        refusal = end_exchange(services, line, relayed, status, started_at, refused=refused)
        if refusal is not None:
            meter_refusal(services, line, refusal)
        shadow = shadow_of(request)
        if shadow is not None and relayed is not None and parsed is not None:  # the client has its answer
            shadow.offer(line.request_id, line.started_at, principal, parsed, relayed)
        # `relayed` holds the response, whose background holds this function: let go of it, and the
        # request's objects are freed at once, not left to the garbage collector as a cycle
        relayed = None

    response.background = _then(response.background, end)
    return response


def http_response(relayed: Relayed) -> Response:
    """The relay's outcome on the wire: a stream as server-sent events (its `settle` run once they
    are over), else the whole body as JSON; nothing for a client that left."""
    if relayed.events is not None:
        settle = BackgroundTask(relayed.settle) if relayed.settle is not None else None
        headers = SSE_HEADERS | relayed.headers
        return EventStreamResponse(relayed.events, media_type="text/event-stream", headers=headers, background=settle)
    if relayed.status == CLIENT_CLOSED_REQUEST:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return Response(relayed.body, status_code=relayed.status, headers=relayed.headers, media_type="application/json")


def _then(background: BackgroundTask | None, end: Callable[[], None]) -> BackgroundTask:
    """`background` (a stream's settlement), then `end`, however the first ends."""

    async def run() -> None:
        try:
            if background is not None:
                await background()
        finally:
            end()

    return BackgroundTask(run)


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
        return services.directory.authenticate(authorization_of(request))
    except UnknownKey:
        return None


def not_routed(request: Request, status: int) -> None:
    """Under /v1/, a path nothing serves (404) or a method its route does not serve (405): logged,
    and counted when the path is a model's (the router's own refusals, see `error_handlers`)."""
    services = services_of(request)
    line = _line(request)
    line.status = status
    if request.url.path in MODEL_PATHS:
        count_refused(services, "", status)
        services.metrics.refused(None, "method_not_allowed" if status == 405 else "unknown_url")
    if services.settings.logging.requests:
        write_line(line, 0.0, services.settings.logging.format)
